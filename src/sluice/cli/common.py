"""What the commands of ``sluice`` share: the one-line failure and its exit status, option
checks, the admin client of a command.

The command group and its wiring are in cli/main.py; the commands in cli/main.py and the
modules it adds (cli/serve.py, cli/consume.py, cli/topic.py …).
"""

from __future__ import annotations

import os
import sys

import click

from sluice import errors

PARTITION = click.IntRange(0, 2**31 - 1)


def fail(message: str, code: int = 1):
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


# Refusals of a value the command was given, whichever side checks it: bad usage (status 2).
USAGE_ERRORS = (errors.UsageError, errors.InvalidTopicName, errors.InvalidPartitions, errors.InvalidConfig,
                errors.InvalidGroup, errors.InvalidSubscription)


def fail_with(exc: errors.SluiceError):
    """One line for ``exc``; exit status 2 for bad usage (``USAGE_ERRORS``), else 1."""
    fail(errors.describe(exc), 2 if isinstance(exc, USAGE_ERRORS) else 1)


def admin(ctx):
    """A blocking admin client of the command's brokers (``--bootstrap``)."""
    from sluice.client.sync import SyncAdmin

    return SyncAdmin(ctx.obj["bootstrap"])


def given(ctx: click.Context, name: str) -> bool:
    """Whether option ``name`` was given on the command line or by the environment."""
    return ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)


def exclusive(ctx: click.Context, *names: str) -> None:
    """A usage error when more than one of the options ``names`` was given."""
    named = [n for n in names if given(ctx, n)]
    if len(named) > 1:
        spelled = {p.name: p.opts[-1] for p in ctx.command.params}
        raise click.UsageError(f"{' and '.join(spelled[n] for n in named)} cannot be used together")


def quiet_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so that the exit flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
