"""Every ``sluice`` command takes ``-h``, and every command that prints data takes
``--json`` and ``--output`` (click's own parsing of the real command tree)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from sluice.cli.main import cli


def commands(group: click.Group = cli, path: tuple[str, ...] = ()):
    yield path, group
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name), command


ALL = list(commands())


@pytest.mark.parametrize(("path", "command"), ALL, ids=[" ".join(p) or "sluice" for p, _ in ALL])
def test_every_command_takes_dash_h(path, command):
    res = CliRunner().invoke(cli, [*path, "-h"], prog_name="sluice")
    assert res.exit_code == 0, res.output
    assert res.output.startswith(f"Usage: sluice {' '.join(path)}".rstrip()), res.output


DATA = {("topic", "list"), ("topic", "describe"), ("group", "list"), ("group", "describe"),
        ("group", "reset-offsets"), ("sub", "list"), ("sub", "describe"), ("txn", "list"),
        ("cluster", "status"), ("cluster", "rebalance")}


def options(command: click.Command) -> set[str]:
    return {o for p in command.params for o in getattr(p, "opts", [])}


def test_data_commands_take_json_and_output():
    found = {path for path, command in ALL if "--json" in options(command) and not isinstance(command, click.Group)}
    assert DATA <= found
    for path, command in ALL:
        if path in DATA:
            assert {"--json", "-o", "--output"} <= options(command), path


def test_every_command_that_talks_to_brokers_takes_bootstrap_after_it():
    for path, command in ALL:
        if not isinstance(command, click.Group) and path not in {("serve",), ("bench",)}:
            assert {"-b", "--bootstrap"} <= options(command), path
