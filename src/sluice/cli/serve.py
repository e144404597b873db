"""``sluice serve``: run a broker.

Its options are ``ServerConfig``'s settings (config.py), with its defaults; the broker is
server/app.py's ``run``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import click

from sluice import errors
from sluice.cli.common import exclusive
from sluice.cli.params import key_values
from sluice.config import ServerConfig

_SERVER = ServerConfig()  # the options' defaults


def _data_dir(path: Path) -> Path:
    """``--data-dir``: a directory, or a path where one can be created."""
    if path.exists() and not path.is_dir():
        raise click.BadParameter(f"{path} exists and is not a directory")
    return path


def _listen_host(ctx, param, host: str) -> str:
    """``--host``: a name or address this machine can listen on (checked by binding a
    throwaway socket to a free port of it)."""
    import socket

    try:
        infos = socket.getaddrinfo(host or None, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise click.BadParameter(f"cannot resolve {host!r}: {getattr(exc, 'strerror', exc)}") from None
    for family, kind, proto, _, addr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.bind(addr)
        except OSError as exc:
            raise click.BadParameter(f"cannot listen on {host!r}: {exc.strerror or exc}") from None
    return host


@click.command()
@click.option("--data-dir", type=click.Path(path_type=Path), default=_SERVER.data_dir, show_default=True,
              callback=lambda ctx, param, path: _data_dir(path),
              help="Directory of the logs and metadata (created if missing).")
@click.option("--host", default=_SERVER.host, show_default=True, callback=_listen_host,
              help="Address to listen on (0.0.0.0: every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=_SERVER.port, show_default=True)
@click.option("--node-id", type=click.IntRange(min=0), default=_SERVER.node_id, show_default=True)
@click.option(
    "--topic-default", "topic_defaults", multiple=True, metavar="KEY=VALUE",
    help="Default topic config, e.g. flush.messages=0 (repeatable).",
)
@click.option("--retention-check-ms", type=click.IntRange(min=10), default=_SERVER.retention_check_ms, show_default=True,
              help="How often segments past retention are deleted.")
@click.option("--hw-checkpoint-ms", type=click.IntRange(min=1), default=_SERVER.hw_checkpoint_ms, show_default=True,
              help="How often high watermarks are written to replication-offset-checkpoint.")
@click.option("--max-connections", type=click.IntRange(min=1), default=_SERVER.max_connections, show_default=True)
@click.option("--max-partitions", type=click.IntRange(min=1), default=_SERVER.max_partitions, show_default=True,
              help="Partitions this broker holds at most, over every topic (internal ones too); "
                   "each keeps files open, so mind the open-files limit (ulimit -n).")
@click.option("--max-frame-bytes", type=click.IntRange(min=1024), default=_SERVER.max_frame_bytes, show_default=True,
              help="Largest request accepted; larger length prefixes close the connection.")
@click.option("--advertise", default=None, metavar="HOST[:PORT]",
              help="Address clients and other brokers are told to connect to (default: the listening "
                   "address; the port defaults to --port), for a broker reached through NAT, a proxy or "
                   "a published container port.")
@click.option("--advertised-address", default=None, hidden=True)  # the old name of --advertise
@click.option("--cluster", default=None, metavar="etcd://HOST:PORT[,HOST:PORT][/NAME]",
              help="Join the cluster whose metadata is in etcd (brokers with distinct "
                   "--node-id); default: a cluster of one, metadata in the data directory.")
@click.option("--session-timeout-ms", type=click.IntRange(min=1000), default=_SERVER.session_timeout_ms, show_default=True,
              help="With --cluster: how long the registration outlives a broker that stopped "
                   "answering; its partitions get new leaders after that.")
@click.option("--replica-lag-time-max-ms", type=click.IntRange(min=1), default=_SERVER.replica_lag_time_max_ms, show_default=True,
              help="A follower that has not caught up for this long leaves the ISR.")
@click.option("--default-replication-factor", type=click.IntRange(min=0), default=_SERVER.default_replication_factor, show_default=True,
              help="Replicas of a topic created without --replication-factor; 0: min(3, live brokers).")
@click.option("--leader-rebalance-interval-ms", type=click.IntRange(min=0), default=_SERVER.leader_rebalance_interval_ms, show_default=True,
              help="How often the controller gives leadership back to preferred replicas; 0: never.")
@click.option("--groups-partitions", type=click.IntRange(1, 10_000), default=_SERVER.groups_partitions, show_default=True,
              help="Partitions of the internal topic __groups (group offsets), when it is created.")
@click.option("--txn-check-timeout-ms", type=click.IntRange(min=1), default=_SERVER.txn_check_timeout_ms, show_default=True,
              help="A half message unresolved this long is checked back with a producer of its group.")
@click.option("--txn-check-interval-ms", type=click.IntRange(min=1), default=_SERVER.txn_check_interval_ms, show_default=True,
              help="How often an unresolved half message is checked back.")
@click.option("--txn-max-checks", type=click.IntRange(min=0), default=_SERVER.txn_max_checks, show_default=True,
              help="Checks before an unresolved half message is rolled back and copied to __txn_discarded.")
@click.pass_context
def serve(ctx, data_dir: Path, host: str, port: int, node_id: int, topic_defaults: tuple[str, ...],
          retention_check_ms: int, hw_checkpoint_ms: int, max_connections: int, max_partitions: int,
          max_frame_bytes: int, advertise: str | None, advertised_address: str | None, cluster: str | None,
          session_timeout_ms: int, replica_lag_time_max_ms: int, default_replication_factor: int,
          leader_rebalance_interval_ms: int, groups_partitions: int, txn_check_timeout_ms: int,
          txn_check_interval_ms: int, txn_max_checks: int) -> None:
    """Run a broker: data in --data-dir, metadata there too unless --cluster names etcd.

    Brokers of one cluster share the --cluster URL and each has its own --node-id and
    data directory.
    """
    from sluice.client.addresses import parse_bootstrap
    from sluice.server.app import run

    if logging.getLogger().level > logging.INFO:
        logging.getLogger("sluice").setLevel(logging.INFO)
    try:
        exclusive(ctx, "advertise", "advertised_address")
        advertise = advertise if advertise is not None else advertised_address
        adv_host = adv_port = None
        if advertise is not None:
            try:
                addresses = parse_bootstrap(advertise)
            except errors.ConfigError as exc:
                raise errors.ConfigError(f"--advertise: {exc}") from None
            if len(addresses) != 1:
                raise errors.ConfigError(f"--advertise takes one HOST[:PORT], got {advertise!r}")
            [(adv_host, adv_port)] = addresses
            if not _has_port(advertise):  # the listening port, as with no --advertise
                adv_port = None
        config = ServerConfig(
            data_dir=data_dir, host=host, port=port, node_id=node_id,
            advertised_host=adv_host, advertised_port=adv_port,
            topic_defaults=key_values(topic_defaults, "--topic-default"),
            retention_check_ms=retention_check_ms, hw_checkpoint_ms=hw_checkpoint_ms,
            max_connections=max_connections, max_partitions=max_partitions,
            max_frame_bytes=max_frame_bytes, cluster=cluster, session_timeout_ms=session_timeout_ms,
            replica_lag_time_max_ms=replica_lag_time_max_ms,
            default_replication_factor=default_replication_factor,
            leader_rebalance_interval_ms=leader_rebalance_interval_ms,
            groups_partitions=groups_partitions, txn_check_timeout_ms=txn_check_timeout_ms,
            txn_check_interval_ms=txn_check_interval_ms, txn_max_checks=txn_max_checks,
        )
    except errors.ConfigError as exc:
        raise errors.UsageError(str(exc)) from None
    try:
        run(config)
    except OSError as exc:
        raise errors.storage_error_from_os(exc, f"data directory {data_dir}") from exc


def _has_port(address: str) -> bool:
    """Does ``host:port`` / ``[v6]:port`` name a port (a bare host or IPv6 address does not)?"""
    address = address.strip()
    if address.startswith("["):
        return "]:" in address
    return address.count(":") == 1
