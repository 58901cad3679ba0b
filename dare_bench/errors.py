"""One exception type for every user-facing failure: the CLI prints its message and exits non-zero."""


class DareBenchError(Exception):
    """Bad input or an unrecoverable condition, explained in one line for the user."""

    exit_code = 2


class ConfigError(DareBenchError):
    """A reproduction / run config / override is invalid."""


class CheckpointError(DareBenchError):
    """A checkpoint directory or file is missing, corrupt or inconsistent with the model."""


class DataError(DareBenchError):
    """A data file is unreadable or has the wrong shape."""


class NotBuiltError(DareBenchError):
    """A pinned setting dare-bench cannot run faithfully yet (e.g. a protocol whose data is not shipped)."""


class SamplerError(DareBenchError):
    """Invalid sampler settings, detected before any forward pass."""


class StoreError(DareBenchError):
    """The results database cannot be opened, migrated or written."""


def missing_extra(package: str, extra: str) -> DareBenchError:
    return DareBenchError(f"{package} is not installed; install the optional extra: pip install 'dare-bench[{extra}]'")


def print_error(exc: DareBenchError, *, as_json: bool) -> None:
    """The CLI's one way to report a failure: one line on stderr; with `--json`, also an object on stdout, since a
    caller that asked for JSON (CI) parses stdout."""
    import json
    import sys

    print(f"error: {exc}", file=sys.stderr)
    if as_json:
        print(json.dumps({"status": "error", "error": str(exc), "error_type": type(exc).__name__,
                          "exit_code": exc.exit_code}), flush=True)
