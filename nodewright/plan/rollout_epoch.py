"""A spec that comes back: which admissions belong to the current rollout.

An admission names the spec fingerprint it was issued for (`plan.rollout`), and a fingerprint is a
digest of the packages. A spec that comes back -- `kubectl nodewright undo`, or an edit reverted by
hand (A -> B -> A) -- therefore has the fingerprint of a rollout that already happened, and the nodes
still carry that rollout's admissions (with its batch and order numbers). Read as admissions of the
current rollout, they made the way back inherit the old rollout: the batch state was not reset (the
compartment had admissions for the current fingerprint), batches of the past were evaluated again and
their numbering went on (batch 1, the canary, and a `pauseAfterBatch` gate on it were skipped), a
compartment that B halted could stay halted, and an admission of the first rollout that had not yet
started its node started it outside any batch, past the ceiling.

So a rollout has an epoch (`RolloutEpoch`): its fingerprint and the order number of its first
admission. Order numbers only grow within a fingerprint (a new admission takes `max(order of the
fingerprint's admissions on the nodes) + 1`, `plan.rollout`), so the admissions of an earlier rollout
of the same spec are exactly those numbered below the epoch's first order. The epoch is persisted in
the NodeWright status (`rolloutFingerprint`, `rolloutFirstOrder`). It changes when the rollout
controller plans a fingerprint other than the persisted one, and then starts above the highest number
on the nodes (`epoch_for`); a status without a fingerprint (never written, or lost) starts no new epoch,
so the admissions on the nodes keep counting as before.

The planner input leaves the older admissions out (`current_nodes`, applied by
`plan.rollout_input.rollout_input`, which the controller, `kubectl nodewright why` and `nodewright plan`
all build their input with): a node that carries one is, for the current rollout, a node without
admission -- pending when it has work, done when not, carry-over while it runs -- exactly as after any
spec change.

Admissions that never started their node (not consumed, nothing running there) are dead once the
rollout they belong to is no longer the current one: the rollout controller removes them
(`dead_admissions`), so a spec that comes back never starts a node on a batch of the past. The node
controller also refuses an admission numbered below the persisted epoch (`usable`), for the moment
between a spec coming back and that removal.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from nodewright.api.admission import Admission
from nodewright.api.models import NodeWrightStatus, Status
from nodewright.plan.rollout import RolloutNode


@dataclass(frozen=True, slots=True)
class RolloutEpoch:
    """The current rollout: the spec fingerprint and the order number of its first admission."""

    fingerprint: str
    first_order: int = 0

    def current(self, admission: Admission | None) -> bool:
        """The admission was issued by this rollout."""
        return (
            admission is not None
            and admission.fingerprint == self.fingerprint
            and admission.order >= self.first_order
        )

    def stale(self, admission: Admission | None) -> bool:
        """The admission is for this spec, but from an earlier rollout of it."""
        return (
            admission is not None
            and admission.fingerprint == self.fingerprint
            and admission.order < self.first_order
        )

    @property
    def key(self) -> str:
        """Names the rollout where its fingerprint alone would name an earlier one too (the keys that
        make a notification go out once): the fingerprint, with the first order when it is not 0."""
        return self.fingerprint if self.first_order == 0 else f"{self.fingerprint}.{self.first_order}"


def epoch_for(
    fingerprint: str, *, status: NodeWrightStatus | None, nodes: Iterable[RolloutNode]
) -> RolloutEpoch:
    """The epoch to plan `fingerprint` in, from the persisted status and the admissions on the nodes.

    The persisted epoch while its fingerprint is the one planned; a new one above every admission for
    `fingerprint` on the nodes when the status names another fingerprint; the persisted first order
    (0 for a status written before epochs existed) when the status names none.
    """
    persisted = status or NodeWrightStatus()
    if persisted.rollout_fingerprint == fingerprint or not persisted.rollout_fingerprint:
        return RolloutEpoch(fingerprint, persisted.rollout_first_order)
    orders = [n.admission.order for n in nodes if n.admission and n.admission.fingerprint == fingerprint]
    return RolloutEpoch(fingerprint, max(orders, default=-1) + 1)


def current_nodes(nodes: Sequence[RolloutNode], epoch: RolloutEpoch) -> list[RolloutNode]:
    """The nodes as the current rollout sees them: an admission of an earlier rollout of the same spec
    is left out (the node counts as not admitted)."""
    return [replace(n, admission=None) if epoch.stale(n.admission) else n for n in nodes]


def dead_admissions(nodes: Sequence[RolloutNode], epoch: RolloutEpoch) -> tuple[str, ...]:
    """Nodes whose admission belongs to another rollout and never started anything that still runs:
    not consumed, and the node not in progress (a node still working under it keeps it, and counts as
    carry-over). Their admission can only ever start a node outside the current rollout's batches."""
    return tuple(
        sorted(
            n.name
            for n in nodes
            if n.admission is not None
            and not n.admission.consumed
            and not epoch.current(n.admission)
            and n.status is not Status.IN_PROGRESS
        )
    )


def order_hint(epoch: RolloutEpoch, status: NodeWrightStatus | None) -> int:
    """The order number the planner numbers new admissions from at least: the persisted counter of the
    current rollout, and never below the epoch's first order."""
    persisted = status or NodeWrightStatus()
    counter = persisted.next_order if persisted.rollout_fingerprint == epoch.fingerprint else 0
    return max(counter, epoch.first_order)


def usable(admission: Admission, *, fingerprint: str, status: NodeWrightStatus | None) -> bool:
    """For the node controller: may this admission start work? Only one for the current fingerprint,
    not consumed, and -- once the status names the fingerprint's epoch -- not from an earlier one."""
    if admission.consumed or admission.fingerprint != fingerprint:
        return False
    persisted = status or NodeWrightStatus()
    if persisted.rollout_fingerprint != fingerprint:
        return True
    return admission.order >= persisted.rollout_first_order
