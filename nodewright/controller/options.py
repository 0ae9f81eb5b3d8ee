"""The operator's options: what `nodewright operator` is told, with the reason for each default.

`OperatorOptions` is the one definition: `nodewright operator`'s command-line flags are generated from
its fields (`cli.operator_cmd`), and each field's documentation (`OPTION_DOCS`) is the flag's help.
"""

from __future__ import annotations

from dataclasses import dataclass

from nodewright.api import constants


@dataclass(frozen=True, slots=True)
class OperatorOptions:
    namespace: str = "nodewright-system"
    agent_image: str = constants.DEFAULT_AGENT_IMAGE
    pause_image: str = "registry.k8s.io/pause:3.10"
    runtime_required_taint: str = f"{constants.DEFAULT_RUNTIME_REQUIRED_TAINT_KEY}=true:NoSchedule"
    copy_dir_root: str = "/var/lib/skyhook"
    log_root: str = "/var/log/skyhook"
    reboot_timeout: float = 1200.0
    reapply_on_reboot: bool = False
    # Run dependents' installs in the pod of the package they depend on (plan.node `chain_for`).
    chain_packages: bool = False
    resync_seconds: float = 600.0
    # drain.policy force deletes pods (needs pod delete in every namespace; the chart grants it only with
    # drain.allowForce). When False such drains keep evicting and say why they do not force.
    allow_force_drain: bool = True
    # Keep the log tail of succeeded attempts too (failed ones are always kept): controller.logstore.
    keep_succeeded_logs: bool = False
    # Drift-check pods in flight at once across all NodeWrights (controller.drift).
    drift_check_limit: int = 4
    # Admissions one rollout pass writes per compartment; the rest of a bigger batch follows in the
    # next passes (plan.rollout "Long batches"), so no pass holds up the other compartments for long.
    admissions_per_pass: int = 32

    @property
    def runtime_required_taint_key(self) -> str:
        return parse_taint(self.runtime_required_taint)[0]


def parse_taint(text: str) -> tuple[str, str | None, str]:
    """`key[=value]:Effect` (kubectl syntax) → (key, value, effect)."""
    spec, sep, effect = text.rpartition(":")
    if not sep or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise ValueError(f"taint {text!r}: expected key[=value]:NoSchedule|PreferNoSchedule|NoExecute")
    key, has_value, value = spec.partition("=")
    if not key:
        raise ValueError(f"taint {text!r}: empty key")
    return key, (value if has_value else None), effect
