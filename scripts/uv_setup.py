"""What scripts/bootstrap.sh needs to install the venvs with uv, which it installs with pip.

uv installs the venvs from the lock files (~45 s against pip's ~130 s for a new venv), pinned in the lock
itself; pip installs it first.

- ``python3 scripts/uv_setup.py entry uv requirements.lock`` prints uv's entry of the lock (its pin and
  every hash) as a requirements file of its own, for pip's ``--require-hashes``.
- ``pip config list | python3 scripts/uv_setup.py sources`` prints where this machine's pip finds packages,
  as uv's arguments, each ended by a NUL byte (bootstrap.sh reads them with ``mapfile -d ''``): uv does not
  read pip's configuration, so the package index, the extra indexes, the find-links directories, an index
  turned off, the hosts trusted without TLS and the CA file pip is set up with (pip.conf in any of its
  places, ``PIP_*`` variables) would be lost, and a machine whose pip uses a mirror would reach
  for PyPI itself.  A setting uv cannot take from the command line (a proxy, a client certificate) is one
  clear error, exit status 2, naming the key, its value and what uv reads instead; nothing is installed.
  pip's constraints (``constraint``; this kind of machine caps torch) are not passed on: the locks pin every
  package exactly, so a constraint could only refuse a pin, and uv's ``--require-hashes`` refuses a
  constraint that is not an exact pin itself (``torch<=2.14.1``: the install stopped).

``pip config list`` shows the configuration files already merged, by section: where ``[global]``,
``[install]`` and the environment set one key, the one ``pip install`` takes wins (the environment over
``[install]`` over ``[global]``); other sections are not ``pip install``'s.  A list's values are separated
by spaces or line breaks, as in pip.conf.
"""

from __future__ import annotations

import ast
import sys

#: the sections ``pip install`` reads, the one it takes last (``pip config list`` names the environment ``:env:``)
SECTIONS = ("global", "install", ":env:")
#: pip's keys with a list of values, and uv's option for each value
LISTS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "trusted-host": "--allow-insecure-host", "cert": "--cert"}
#: pip's keys that uv takes only from its environment: what it reads instead
UNSUPPORTED = {"proxy": "HTTPS_PROXY / HTTP_PROXY / ALL_PROXY", "client-cert": "SSL_CLIENT_CERT"}
KEYS = {*LISTS, "no-index", *UNSUPPORTED}


class UnsupportedSetting(Exception):
    """pip is set up with a setting uv cannot be given on its command line."""


def lock_entry(lock_text: str, name: str) -> str:
    """The entry of ``name`` in a hash-pinned lock (its ``name==version`` line and its ``--hash`` lines, the
    comments after it left out), a requirements file by itself; empty when the lock has none."""
    lines: list[str] = []
    for line in lock_text.splitlines():
        if lines and not line.lstrip().startswith("--hash="):
            break
        if lines or line.startswith(f"{name}=="):
            lines.append(line.rstrip())
    if lines:
        lines[-1] = lines[-1].removesuffix("\\").rstrip()
    return "\n".join(lines)


def pip_settings(listing: str) -> dict[str, str]:
    """``{key: value}`` of the keys in :data:`KEYS`, from ``pip config list``'s lines (``section.key='value'``),
    each key's value from the section ``pip install`` takes."""
    found: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        name, sep, quoted = line.strip().partition("=")
        section, _, key = name.rpartition(".")
        if not sep or section not in SECTIONS or key not in KEYS:
            continue
        rank = SECTIONS.index(section)
        try:
            value = ast.literal_eval(quoted)
        except (ValueError, SyntaxError):
            value = quoted.strip("'\"")
        if key not in found or rank >= found[key][0]:
            found[key] = (rank, str(value))
    return {key: value for key, (_, value) in found.items()}


def uv_arguments(settings: dict[str, str]) -> list[str]:
    """uv's arguments for ``settings`` (:func:`pip_settings`): an option and its value for each value of a list
    (the CA file too, which replaces uv's own roots as it replaces pip's), ``--no-index`` where pip has it on.
    Raises :class:`UnsupportedSetting` for a key of :data:`UNSUPPORTED`."""
    for key, instead in UNSUPPORTED.items():
        if settings.get(key):
            raise UnsupportedSetting(
                f"pip is set up with {key}={settings[key]!r}, which uv (scripts/bootstrap.sh installs the venvs "
                f"with it) cannot be given on its command line; set {instead} in the environment instead "
                "(pip reads it too) and remove the setting from pip's configuration")
    arguments = [part for key, option in LISTS.items() for value in settings.get(key, "").split()
                 for part in (option, value)]
    if settings.get("no-index", "").strip().lower() in ("1", "true", "yes", "on"):
        arguments.append("--no-index")
    return arguments


def main(argv: list[str]) -> int:
    if argv[:1] == ["entry"] and len(argv) == 3:
        with open(argv[2], encoding="utf-8") as lock:
            entry = lock_entry(lock.read(), argv[1])
        if not entry:
            print(f"uv_setup: {argv[2]} pins no {argv[1]}", file=sys.stderr)
            return 1
        print(entry)
        return 0
    if argv == ["sources"]:
        try:
            arguments = uv_arguments(pip_settings(sys.stdin.read()))
        except UnsupportedSetting as exc:
            print(f"bootstrap: {exc}", file=sys.stderr)
            return 2
        sys.stdout.write("".join(f"{a}\0" for a in arguments))
        return 0
    print("usage: uv_setup.py entry NAME LOCK | uv_setup.py sources < (pip config list)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
