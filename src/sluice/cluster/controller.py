"""The controller: one broker of the cluster, elected through the metadata store, that
moves partition leadership.

Every broker runs ``Controller.run``; the store's election picks one at a time
(``MetadataStore.campaign``).  During its term the controller reconciles every partition
with the live brokers each time they change, each time a partition state it sees
(``state_changed``: every broker's state watch tells its controller) has no live leader,
each time a topic's config allows unclean elections (``config_changed``: the brokers
re-read topic records at least every 2 s), and every ``leader_rebalance_interval_ms``
(after which it also runs ``preferred_election``):

- a leader that is gone (its registration expired) is replaced by the first replica, in
  assignment order, that is alive and in the ISR, in a new leader epoch; the dead broker
  leaves the ISR.  With none alive in the ISR the partition goes offline (leader -1, ISR
  kept: the last in-sync replica is elected when it returns), unless the topic sets
  ``unclean.leader.election.enable=true``: then any live replica leads (acknowledged
  writes it lacks are lost).  An offline partition gets a leader as soon as one of these
  is eligible: a replica coming back, an unclean election allowed later (``sluice topic
  alter``), or a state change (a broker with a new data directory leaving the ISR,
  broker/replication/) all lead to a reconcile pass;
- an in-sync replica that is gone leaves the ISR (the leader would drop it after its lag
  timeout anyway; this is sooner);
- leadership moves back to the preferred replica (the first of the assignment) when it is
  alive, in sync and not leading (``preferred_election``, also run on request through the
  ``ELECT_LEADERS`` API: ``sluice cluster rebalance``, which first gives offline
  partitions a leader with ``elect_offline``, as a reconcile pass would, and reports those
  it cannot with ``offline_reason``);
- a pending replica move (``TopicRecord.moving``, recorded by ``sluice cluster
  rebalance``: broker/replication/reassignment.py) completes once every replica the partition keeps
  is in the ISR: a leader that leaves first hands leadership to a kept in-sync live
  replica (CAS, new epoch), then the leaving replicas are dropped (``reassign``).  This
  runs on every reconcile pass and every ``MOVES_CHECK_S`` while any move is pending;
- a topic short of its replication factor (an internal topic created while brokers were
  down) gets replicas on live brokers (cluster/strength.py), on every reconcile pass.

Each change is a compare-and-swap on the partition state's version, so a deposed
controller, or a leader changing its ISR at the same moment, cannot overwrite a newer
state: the loser reads again.  While the store is unreachable nothing changes (no
elections), and the brokers go on serving what they lead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from sluice.cluster.store import Leadership, MetadataStore, PartitionState, TopicRecord
from sluice.cluster.strength import restore_strength
from sluice.errors import MetadataUnavailable, UnknownPartition, UnknownTopic

log = logging.getLogger("sluice.controller")

RETRY_S = 0.5
MOVES_CHECK_S = 0.5  # how often pending replica moves are looked at while there are any
ELECT_TRIES = 5  # elect_offline: reads of a partition state that keeps changing under it


def decide(record: TopicRecord, index: int, state: PartitionState, live: set[int]) -> PartitionState | None:
    """The state partition ``index`` of ``record`` should move to given the live brokers,
    or None to leave it as it is.  Pure."""
    replicas = record.assignment[index]
    if state.leader in live:
        isr = [r for r in state.isr if r in live]
        if isr != list(state.isr):
            return PartitionState(state.leader, state.leader_epoch, isr)
        return None
    in_sync = [r for r in replicas if r in state.isr and r in live]
    if in_sync:
        return PartitionState(in_sync[0], state.leader_epoch + 1, [r for r in state.isr if r in live])
    alive = [r for r in replicas if r in live]
    if alive and record.config.get("unclean.leader.election.enable") == "true":
        log.warning(
            "%s-%d: unclean election of broker %d (no in-sync replica alive): "
            "acknowledged writes it lacks are lost", record.name, index, alive[0],
        )
        return PartitionState(alive[0], state.leader_epoch + 1, [alive[0]])
    if state.leader != -1:
        return PartitionState(-1, state.leader_epoch + 1, list(state.isr))
    return None


def offline_reason(record: TopicRecord, index: int, state: PartitionState, live: set[int]) -> str:
    """Why ``decide`` gives partition ``index`` (its leader not alive) no leader.  Pure."""
    replicas = record.assignment[index]
    name = f"{record.name}-{index}"
    alive = [r for r in replicas if r in live]
    if not alive:
        return f"{name} has no live replica (replicas {replicas}): it gets a leader when one comes back"
    return (
        f"{name} has no live in-sync replica (ISR {list(state.isr)}, live replicas {alive}): it "
        "gets a leader when an in-sync replica comes back, or now with the topic config "
        "unclean.leader.election.enable=true, which loses the acknowledged writes that replica lacks"
    )


def preferred(record: TopicRecord, index: int, state: PartitionState, live: set[int]) -> PartitionState | None:
    """The state that gives partition ``index`` back to its preferred replica, or None."""
    first = record.assignment[index][0]
    if state.leader == first or first not in live or first not in state.isr:
        return None
    return PartitionState(first, state.leader_epoch + 1, list(state.isr))


def move_step(record: TopicRecord, index: int, state: PartitionState, live: set[int]) -> PartitionState | bool:
    """The next step of partition ``index``'s pending move: False to wait (a replica it
    keeps is not in sync yet, or no kept in-sync replica is alive to lead), a new state
    when the leader leaves (leadership moves first, to the first kept in-sync live
    replica), True when the leaving replicas can be dropped now.  Pure."""
    keep = record.target(index)
    if not set(keep) <= set(state.isr):
        return False
    if state.leader in keep:
        return True
    successors = [r for r in keep if r in live]
    if not successors:
        return False
    return PartitionState(successors[0], state.leader_epoch + 1, list(state.isr))


async def complete_moves(store: MetadataStore, record: TopicRecord, live: set[int]) -> list[int]:
    """Take each pending move of ``record`` one ``move_step`` further; returns the
    partitions whose move completed."""
    if not record.moving:
        return []
    states = await store.partition_states(record.name)
    done = {}
    for p in sorted(record.moving):
        step = move_step(record, p, states[p], live)
        if isinstance(step, PartitionState):
            if await store.cas_partition_state(record.name, p, states[p].version, step):
                log.info("%s-%d: leadership %d -> %d before replicas %s leave", record.name, p,
                         states[p].leader, step.leader, record.moving[p])
            continue  # dropped on a later pass, once the new state is read back
        if step:
            done[p] = record.target(p)
    if done:
        await store.reassign(record.name, done)
        for p, keep in done.items():
            log.info("%s-%d: move done, replicas %s (%s left)", record.name, p, keep, record.moving[p])
    return sorted(done)


async def preferred_election(store: MetadataStore, record: TopicRecord, live: set[int]) -> list[tuple[int, int]]:
    """Move each partition of ``record`` to its preferred replica where ``preferred``
    says so; returns the (partition, new leader) moved."""
    moved = []
    for i, st in enumerate(await store.partition_states(record.name)):
        new = preferred(record, i, st, live)
        if new is not None and await store.cas_partition_state(record.name, i, st.version, new):
            log.info("%s-%d: leadership back to preferred replica %d", record.name, i, new.leader)
            moved.append((i, new.leader))
    return moved


async def elect_offline(
    store: MetadataStore, record: TopicRecord, live: set[int]
) -> tuple[list[tuple[int, int]], list[tuple[int, str]]]:
    """Give each partition of ``record`` whose leader is not alive the leader ``decide``
    picks (CAS; a state changed meanwhile is read again); returns the (partition, new
    leader) elected and the (partition, ``offline_reason``) left without one."""
    elected, failed = [], []
    states = await store.partition_states(record.name)
    for i in range(record.partitions):
        for _ in range(ELECT_TRIES):
            st = states[i]
            if st.leader in live:
                break
            new = decide(record, i, st, live)
            if new is not None and not await store.cas_partition_state(record.name, i, st.version, new):
                states = await store.partition_states(record.name)  # changed meanwhile: again
                continue
            if new is not None and new.leader >= 0:
                log.info("%s-%d: leader %d -> %d, epoch %d, ISR %s (live brokers %s)",
                         record.name, i, st.leader, new.leader, new.leader_epoch, new.isr, sorted(live))
                elected.append((i, new.leader))
            else:
                failed.append((i, offline_reason(record, i, st, live)))
            break
        else:
            failed.append((i, f"{record.name}-{i}: its state kept changing meanwhile; retry"))
    return elected, failed


class Controller:
    def __init__(
        self, store: MetadataStore, node_id: int, rebalance_interval_ms: int,
        on_term: Callable[[], None] = lambda: None,
    ) -> None:
        self.on_term = on_term  # called when a term starts and when it ends
        self.store = store
        self.node_id = node_id
        self.rebalance_s = rebalance_interval_ms / 1000
        self.live: set[int] = set()
        self.moves_pending = False  # some topic had a pending replica move at the last look
        self._reconcile_due = asyncio.Event()
        self._moves_changed = asyncio.Event()

    async def run(self) -> None:
        """Campaign, act while elected, campaign again; until cancelled."""
        watcher = asyncio.ensure_future(self._watch_brokers())
        try:
            while True:
                try:
                    term = await self.store.campaign(self.node_id)
                except MetadataUnavailable:
                    await asyncio.sleep(RETRY_S)
                    continue
                log.info("broker %d is the controller (term %d)", self.node_id, term.epoch)
                self.on_term()
                await self._serve(term)
                log.info("broker %d is no longer the controller", self.node_id)
                self.on_term()
        finally:
            watcher.cancel()

    async def _watch_brokers(self) -> None:
        while True:
            try:
                async for regs in self.store.watch_brokers():
                    self.live = {r.node_id for r in regs}
                    self._reconcile_due.set()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("watching brokers failed; starting over")
                await asyncio.sleep(RETRY_S)

    def state_changed(self, state: PartitionState | None) -> None:
        """A partition state changed (the broker's state watch): one without a live leader
        gets a reconcile pass soon, which elects a leader if a replica is eligible.  Call
        from the event loop."""
        if state is not None and state.leader not in self.live:
            self._reconcile_due.set()

    def config_changed(self, record: TopicRecord) -> None:
        """``record``'s config changed (applied on this broker): when it allows unclean
        elections, a reconcile pass soon elects a live replica of its offline partitions.
        Call from the event loop."""
        if record.config.get("unclean.leader.election.enable") == "true":
            self._reconcile_due.set()

    def poke(self) -> None:
        """Look for pending replica moves soon (a partition state changed: a move may have
        been recorded, or a replica may have joined an ISR).  Call from the event loop."""
        self.moves_pending = True
        self._moves_changed.set()

    async def _serve(self, term: Leadership) -> None:
        loop = asyncio.get_running_loop()
        next_rebalance = loop.time() + self.rebalance_s
        next_moves = loop.time()
        lost = asyncio.ensure_future(term.lost.wait())
        try:
            self._reconcile_due.set()
            while not term.lost.is_set():
                if self._reconcile_due.is_set():
                    self._reconcile_due.clear()
                    await self._guarded(self.reconcile)  # completes moves too
                    next_moves = loop.time() + MOVES_CHECK_S
                if self.rebalance_s > 0 and loop.time() >= next_rebalance:
                    next_rebalance = loop.time() + self.rebalance_s
                    await self._guarded(self.rebalance)
                if self.moves_pending and loop.time() >= next_moves:
                    next_moves = loop.time() + MOVES_CHECK_S
                    await self._guarded(self.complete_moves)
                waits = [asyncio.ensure_future(self._reconcile_due.wait()), lost]
                timeout = max(0.0, next_rebalance - loop.time()) if self.rebalance_s > 0 else None
                if self.moves_pending:
                    left = max(0.0, next_moves - loop.time())
                    timeout = left if timeout is None else min(timeout, left)
                else:
                    waits.append(asyncio.ensure_future(self._moves_changed.wait()))
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                for w in waits[:1] + waits[2:]:
                    w.cancel()
        finally:
            lost.cancel()

    async def _guarded(self, step) -> None:
        try:
            await step()
        except MetadataUnavailable as exc:
            log.warning("controller: %s; retrying", exc)
            await asyncio.sleep(RETRY_S)
            self._reconcile_due.set()
        except Exception:
            log.exception("controller step failed; retrying")
            await asyncio.sleep(RETRY_S)
            self._reconcile_due.set()

    async def reconcile(self) -> None:
        """Elect leaders for partitions whose leader is gone; drop dead brokers from ISRs;
        then ``complete_moves``; then add replicas to topics short of their replication
        factor where live brokers can hold them (cluster/strength.py)."""
        live = set(self.live)
        if not live:
            return  # a store outage looks like no brokers at all: change nothing
        for record in (await self.store.topics()).values():
            try:
                states = await self.store.partition_states(record.name)
            except UnknownTopic:
                continue
            for i, st in enumerate(states):
                new = decide(record, i, st, live)
                if new is None:
                    continue
                try:
                    done = await self.store.cas_partition_state(record.name, i, st.version, new)
                except (UnknownTopic, UnknownPartition):
                    break
                if done:
                    log.info(
                        "%s-%d: leader %d -> %d, epoch %d, ISR %s (live brokers %s)",
                        record.name, i, st.leader, new.leader, new.leader_epoch, new.isr, sorted(live),
                    )
                else:
                    self._reconcile_due.set()  # raced a leader's ISR change: look again
        await self.complete_moves()
        await restore_strength(self.store, live)

    async def complete_moves(self) -> None:
        """Take every pending replica move a step further (``complete_moves``).

        A ``poke`` while this runs may tell of a move it has not seen: it keeps
        ``moves_pending`` set for another look.  (Were the poke's event left set with
        ``moves_pending`` false, the serving loop would wake on it again and again.)"""
        live = set(self.live)
        if not live:
            return
        self._moves_changed.clear()
        pending = False
        for record in (await self.store.topics()).values():
            try:
                done = await complete_moves(self.store, record, live)
            except (UnknownTopic, UnknownPartition):
                continue
            pending = pending or len(done) < len(record.moving)
        self.moves_pending = pending or self._moves_changed.is_set()

    async def rebalance(self) -> None:
        """The periodic pass: ``reconcile`` (offline partitions whose replicas are eligible
        get a leader even when nothing woke the controller), then ``preferred_election``."""
        await self.reconcile()
        live = set(self.live)
        if not live:
            return
        for record in (await self.store.topics()).values():
            try:
                await preferred_election(self.store, record, live)
            except (UnknownTopic, UnknownPartition):
                continue
