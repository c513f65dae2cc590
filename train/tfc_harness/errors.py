"""The harness's own exceptions: failures whose message is meant for the operator, printed as one line.

The controller imports these to turn a harness failure into its own one-line error (no traceback), e.g.
``except tfc_harness.errors.HarnessError as exc: raise TfclusterError(str(exc))``.
"""

from __future__ import annotations

import re


class HarnessError(RuntimeError):
    """A failure with a message meant for the operator."""


class ModelModuleError(HarnessError):
    """The user's model module cannot be found, lacks part of the interface, or one of its functions failed
    or returned something unusable.  The message names the module's file and the function, e.g.
    ``model module mymodel.py: make_dataset() returned y with float64 values in the 'train' split; ...``.
    """


#: TensorFlow's lines around an op error's cause: the graph's headline, where the op was defined and its stack,
#: the failing nodes (``\t [[{{node Reshape}}]]``, indented like the stack), a traced function's headline
_TF_FRAME = re.compile(r"^(\s|Graph execution error:|Detected at node|<stack traces unavailable>)")
#: TensorFlow's names inside a cause line: graph functions, ops
_TF_NAMES = re.compile(r"\{\{function_node [^}]*\}\}|\s*\[Op:[^\]]*\](\s*name:\s*\S*)?")


def cause(message: str) -> str:
    """The line of an error's message that says what went wrong. A TensorFlow op error (``Graph execution
    error:``, where it was defined, its stack, then the cause, then the failing nodes) gives its cause, without
    graph-function and op names: ``Input to reshape is a tensor with 225 values, but the requested shape has
    256``; an error in traced user code (``in user code:``, its stack, then the error) its last line; another
    message its first line."""
    lines = [ln for ln in message.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    if lines[0].rstrip(": ").endswith("in user code"):
        line = lines[-1]
    elif _TF_FRAME.match(lines[0]):
        line = next((ln for ln in lines if not _TF_FRAME.match(ln)), lines[0])
    else:
        line = lines[0]
    return _TF_NAMES.sub("", line.strip()).strip()
