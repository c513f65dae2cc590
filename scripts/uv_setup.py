"""What scripts/bootstrap.sh needs to install the venvs with uv, which it installs with pip.

uv installs the venvs from the lock files (~45 s against pip's ~130 s for a new venv), pinned in the lock
itself; pip installs it first.

- ``python3 scripts/uv_setup.py entry uv requirements.lock`` prints uv's entry of the lock (its pin and
  every hash) as a requirements file of its own, for pip's ``--require-hashes``.
- ``pip config list | python3 scripts/uv_setup.py sources`` prints where this machine's pip finds packages,
  as uv's options, one with its value a line: uv does not read pip's configuration, so the package index, the extra
  indexes, the find-links directories and the CA file pip is set up with (pip.conf in any of its places,
  ``PIP_*`` variables) would be lost, and a machine whose pip uses a mirror would reach for PyPI itself.
  ``--index-url URL``, ``--extra-index-url URL`` and ``--find-links PATH`` pairs, and ``cert PATH`` for
  the CA file (bootstrap.sh exports it as ``SSL_CERT_FILE``, which uv reads).  ``pip config list`` shows the
configuration files already merged, by section: where ``[global]``, ``[install]`` and the environment set one
key, the one ``pip install`` takes wins (the environment over ``[install]`` over ``[global]``); other sections
are not ``pip install``'s.
"""

from __future__ import annotations

import ast
import sys

#: the sections ``pip install`` reads, the one it takes last (``pip config list`` names the environment ``:env:``)
SECTIONS = ("global", "install", ":env:")
OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links"}


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
    """``{key: value}`` of the keys in :data:`OPTIONS` and ``cert``, from ``pip config list``'s lines
    (``scope.key='value'``), each key's value from the section pip takes."""
    found: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        name, sep, quoted = line.strip().partition("=")
        section, _, key = name.rpartition(".")
        if not sep or section not in SECTIONS or (key not in OPTIONS and key != "cert"):
            continue
        rank = SECTIONS.index(section)
        try:
            value = ast.literal_eval(quoted)
        except (ValueError, SyntaxError):
            value = quoted.strip("'\"")
        if key not in found or rank >= found[key][0]:
            found[key] = (rank, str(value))
    return {key: value for key, (_, value) in found.items()}


def uv_options(settings: dict[str, str]) -> list[str]:
    """uv's options for ``settings`` (:func:`pip_settings`), ``"--option value"`` each, then ``"cert PATH"``
    when pip has a CA file."""
    lines = [f"{option} {value}" for key, option in OPTIONS.items() for value in settings.get(key, "").split()]
    if settings.get("cert"):
        lines.append(f"cert {settings['cert']}")
    return lines


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
        print("\n".join(uv_options(pip_settings(sys.stdin.read()))))
        return 0
    print("usage: uv_setup.py entry NAME LOCK | uv_setup.py sources < (pip config list)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
