"""The harness's own exceptions: failures whose message is meant for the operator, printed as one line.

The controller imports these to turn a harness failure into its own one-line error (no traceback), e.g.
``except tfc_harness.errors.HarnessError as exc: raise TfclusterError(str(exc))``.
"""

from __future__ import annotations


class HarnessError(RuntimeError):
    """A failure with a message meant for the operator."""


class ModelModuleError(HarnessError):
    """The user's model module cannot be found, lacks part of the interface, or one of its functions failed
    or returned something unusable.  The message names the module's file and the function, e.g.
    ``model module mymodel.py: make_dataset() returned y with float64 values in the 'train' split; ...``.
    """
