"""The harness's own exceptions: failures whose message is meant for the operator, printed as one line.

The controller imports these to turn a harness failure into its own one-line error (no traceback), e.g.
``except tfc_harness.errors.HarnessError as exc: raise TfclusterError(str(exc))``.
"""

from __future__ import annotations

import re

#: the exit code of a task whose failure a restart would repeat: its supervisor (``tfc-supervise``, which keeps
#: its own copy of the number) records it failed at once instead of restarting it
FINAL_EXIT_CODE = 6


def counted(n: int, thing: str) -> str:
    """``1 file``, ``2 files``: a count and its noun, for a message."""
    return f"{n} {thing}{'' if n == 1 else 's'}"


class HarnessError(RuntimeError):
    """A failure with a message meant for the operator."""


class FinalError(HarnessError):
    """A failure a restart of the task would repeat: the run is already published, its checkpoint is past its
    steps, the user's module fails (:func:`is_final` keeps one behind which lies a transient error restartable)."""


#: where the errors come from that a restart may not meet again: TensorFlow's op errors (a lost peer or ps:
#: UnavailableError, AbortedError), the S3 client's and the HTTP libraries' (OSError is judged by its type)
_TRANSIENT_MODULES = ("tensorflow.python.framework.errors", "botocore.", "urllib3.", "requests.", "grpc")


def is_final(exc: BaseException) -> bool:
    """Whether a restart of the task would fail the same way: a :class:`FinalError` with no transient error
    among the errors that caused it or were being handled when it was raised (``__cause__``, ``__context__``):
    an ``OSError`` (a file, the network), a TensorFlow op error (a peer or ps lost while the user's
    ``build_model`` made its variables there), an S3 or HTTP client's error."""
    if not isinstance(exc, FinalError):
        return False
    seen, todo = set(), [exc.__cause__, exc.__context__]
    while todo:
        inner = todo.pop()
        if inner is None or id(inner) in seen:
            continue
        seen.add(id(inner))
        if isinstance(inner, OSError) or type(inner).__module__.startswith(_TRANSIENT_MODULES):
            return False
        todo += [inner.__cause__, inner.__context__]
    return True


#: TensorFlow's words for a label that is none of the model's classes (its sparse categorical losses and metrics)
_LABEL_OUTSIDE_THE_CLASSES = re.compile(r"Received a label value of (-?\d+) which is outside the valid range of "
                                        r"\[0, (\d+)\)")


def is_tensorflow_error(exc: BaseException) -> bool:
    """Whether ``exc`` is one of TensorFlow's own (an op error: its words are TensorFlow's, not a user's)."""
    return type(exc).__module__.startswith("tensorflow")


def label_outside_the_classes(exc: BaseException) -> tuple[int, int] | None:
    """``(label, classes)`` when ``exc`` is TensorFlow's error for a label outside the model's classes
    (``Received a label value of 4 which is outside the valid range of [0, 4)``), else None."""
    found = _LABEL_OUTSIDE_THE_CLASSES.search(str(exc)) if is_tensorflow_error(exc) else None
    return (int(found.group(1)), int(found.group(2))) if found else None


#: the words of the training data's check of labels under a loss that takes them between 0 and 1
#: (:func:`tfc_harness.inputs.labels_between_0_and_1`)
LABEL_OUTSIDE_0_TO_1 = "the training data hold a label outside 0 to 1"
#: how TensorFlow words a failed ``tf.debugging.Assert``: ``assertion failed: [<message>] [<value>]``
_LABEL_ASSERTION = re.compile(r"assertion failed: \[(" + re.escape(LABEL_OUTSIDE_0_TO_1) + r"[^\]]*)\] \[([^\]]*)\]")


def outside_the_classes(value: int, classes: int, where: str = "") -> str:
    """What the data hold and what to do, for TensorFlow's error on a label outside the model's classes
    (:func:`label_outside_the_classes`); ``where``: the words after the classes (which examples)."""
    return (f"the data hold the label {value}, outside the model's {classes} classes (class ids 0 to "
            f"{classes - 1}){where}: number the classes from 0, or give the model's last layer one unit per class")


def bad_labels(exc: BaseException) -> bool:
    """Whether ``exc`` is TensorFlow's error for a label outside the model's classes, or the training data's for
    a label outside 0 to 1 under a loss that takes probabilities (:data:`LABEL_OUTSIDE_0_TO_1`): the data hold
    it, so a restarted task meets it again."""
    return label_outside_the_classes(exc) is not None or (is_tensorflow_error(exc)
                                                           and LABEL_OUTSIDE_0_TO_1 in str(exc))


class ModelModuleError(FinalError):
    """The user's model module cannot be found, lacks part of the interface, or one of its functions failed
    or returned something unusable.  The message names the module's file and the function, e.g.
    ``model module mymodel.py: make_dataset() returned y with float64 values in the 'train' split; ...``.
    """


#: TensorFlow's lines around an op error's cause: the graph's headline, where the op was defined and its stack,
#: the failing nodes (``\t [[{{node Reshape}}]]``, indented like the stack)
_TF_FRAME = re.compile(r"^(\s|Graph execution error:|Detected at node|<stack traces unavailable>)")
#: TensorFlow's names inside a cause line: graph functions, ops
_TF_NAMES = re.compile(r"\{\{function_node [^}]*\}\}|\s*\[Op:[^\]]*\](\s*name:\s*\S*)?")
#: tf.data's words before an error in a function it maps (the user's ``decode``, a reader's own check)
_TF_DATA_WRAPPER = re.compile(r"^Error in user-defined function passed to \S+ transformation with iterator: \S+: ")
#: several tasks' or devices' errors at once (``2 root error(s) found.``), each then ``  (k) CODE: cause``
_ROOT_ERRORS = re.compile(r"^\d+ root error\(s\) found")
_ROOT_CAUSE = re.compile(r"^\s*\(\d+\)\s*[A-Z_]+:\s*")
#: a Python error's line: ``ValueError: ...``
_PY_ERROR = re.compile(r"^\s*[A-Za-z_][\w.]*(Error|Exception|Exhausted|Exit|Interrupt):")
#: Keras's wrapper of an error inside a layer's call: the cause is between these
_KERAS_HEAD, _KERAS_ARGS = "Exception encountered when calling", "Arguments received by"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def message_lines(message: str, keep_before: bool = False) -> list[str]:
    """An error message's non-blank lines (their indentation kept), without terminal colours and without Keras's
    wrapper of an error inside a layer's call ("Exception encountered when calling Sequential.call()." first,
    "Arguments received by ..." and each argument last): the cause between them is kept, and with
    ``keep_before`` the lines before the wrapper too (a traced error's ``in user code:`` and the user's file
    and line)."""
    lines = [ln for ln in _ANSI.sub("", message).strip().splitlines() if ln.strip()]
    head = next((i for i, ln in enumerate(lines) if _KERAS_HEAD in ln), None)
    if head is None:
        return lines
    end = next((i for i, ln in enumerate(lines) if i > head and ln.strip().startswith(_KERAS_ARGS)), len(lines))
    inner = lines[head + 1:end] or lines[head:head + 1]
    return lines[:head] + inner if keep_before else inner


def cause(message: str) -> str:
    """The line of an error's message that says what went wrong, without TensorFlow's graph-function and op
    names: a TensorFlow op error's cause (after ``Graph execution error:``, where the op was defined and its
    stack: ``Input to reshape is a tensor with 225 values, but the requested shape has 256``), the first of
    several root errors', an error in traced user code (``in user code:``, its stack, then the error: the
    error's first line), the cause Keras wraps in ``Exception encountered when calling ...``; another message's
    first line."""
    lines = message_lines(message)
    if not lines:
        return ""
    if lines[0].rstrip(": ").endswith("in user code"):
        line = next((ln for ln in lines[1:] if _PY_ERROR.match(ln)), lines[-1])
    elif _TF_FRAME.match(lines[0]):
        line = next((ln for ln in lines if not _TF_FRAME.match(ln)), lines[0])
    else:
        line = lines[0]
    if _ROOT_ERRORS.match(line.strip()):
        line = next((_ROOT_CAUSE.sub("", ln) for ln in lines if _ROOT_CAUSE.match(ln)), line)
    return _TF_DATA_WRAPPER.sub("", _TF_NAMES.sub("", line.strip()).strip())


def described(exc: BaseException) -> str:
    """``<type>: <cause>`` of an exception (:func:`cause`), the type once when the cause names one already; for
    TensorFlow's error on a label outside the model's classes, what the data hold and what to do (its own words
    list the batch's labels, 64 numbers and more)."""
    outside = label_outside_the_classes(exc)
    if outside:
        value, classes = outside
        return f"{type(exc).__name__}: " + outside_the_classes(value, classes,
                                                               ", past the first examples the controller checked")
    checked = _LABEL_ASSERTION.search(str(exc)) if bad_labels(exc) else None
    if checked:      # the training data's own check (inputs.labels_between_0_and_1): its words, then the label
        return f"{type(exc).__name__}: {checked.group(1)} {checked.group(2)}"
    line = cause(str(exc))
    return line if _PY_ERROR.match(line) else f"{type(exc).__name__}: {line}"
