"""Error types and the exit codes the CLI maps them to."""

EXIT_FAILURE = 1
EXIT_USAGE = 2  # bad configuration or arguments: nothing was created


class TfclusterError(Exception):
    """A failure the user can act on; printed without a traceback."""

    exit_code = EXIT_FAILURE


#: a ConfigError's value where the field was not given at all (said as "missing", not as a default's 0 or None)
MISSING = type("Missing", (), {"__repr__": lambda self: "MISSING"})()


class ConfigError(TfclusterError):
    """A bad value in the configuration, an override or an argument.

    The message names the field, the bad value (or that it is :data:`MISSING`) and what is allowed.
    """

    exit_code = EXIT_USAGE

    def __init__(self, field: str, value, allowed: str):
        self.field = field
        self.value = value
        self.allowed = allowed
        got = "missing" if value is MISSING else f"got {value!r}"
        super().__init__(f"invalid configuration: {field}: {got}; allowed: {allowed}")


class ProvisionError(TfclusterError):
    """Provisioning or teardown failed."""


class GuardError(TfclusterError):
    """A step was refused to keep something the user cares about: a destructive one (a model not yet safe), or
    one that would stop another controller's work (:class:`Busy`)."""

    exit_code = 3


class Busy(GuardError):
    """Another tfcluster process holds the cluster (a train, a sweep): refused at once, naming it. Nothing of
    that cluster is torn down after it, whatever FORCE says: it is another process's."""


class JobError(TfclusterError):
    """The user's model module or data cannot be used; the message names the module (and function) or
    the data file and what is wrong.  Found before anything is created (validate, up) or before the nodes
    train (train)."""

    exit_code = EXIT_USAGE


class DataNotReady(JobError):
    """The files the cluster file names are not in the object store yet (no such bucket, nothing matches, the
    local store not running): ``up`` refuses, ``validate`` reports it and passes (they may be uploaded after it)."""


class ClusterMismatch(TfclusterError):
    """The configuration asks for another cluster than the one that is up (its provider, strategy or node
    counts): nothing was changed; the message says what differs."""

    exit_code = EXIT_USAGE
