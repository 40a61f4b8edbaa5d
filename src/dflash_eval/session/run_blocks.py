"""The typed blocks of what a run ran on (:mod:`dflash_eval.session.rows` says how a row turns into eval.json's object
and back): the target (:class:`TargetBlock`), the τ-relevant settings (:class:`ContextBlock`) and the provenance
(:class:`ProvenanceBlock`: the backend, the library versions, the host and git state, the kernel probe with the
kernel changes it and the witness noticed).

Each states which of its keys eval.json always holds, which it may leave out (an older run, a target that was not
loaded, a greedy run without the sampling fields) and which it may hold as null, as eval.schema.json documents them:
a field typed ``X | None | Absent`` is :data:`~dflash_eval.session.rows.ABSENT` where the key is missing and None
where it is null, so a report tells "not recorded" from "recorded as unknown". The kernel probe's own probes and the
witness's checks keep the layout their writers (:mod:`dflash_eval.target.kernel_registry`,
:mod:`dflash_eval.features.witness`) own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dflash_eval.session.rows import OPTIONAL, Absent, Row, _absent, _opt

__all__ = ["TargetBlock", "ContextBlock", "GitState", "KernelChange", "KernelProbeBlock", "ProvenanceBlock"]


@dataclass
class TargetBlock(Row):
    """The target model (:func:`dflash_eval.inputs.run_inputs.describe_target`): its path and content identity
    (null: not known), and, where recorded, its shape (null: its config does not say), dtype and device, and whether
    the run loaded it."""

    path: str
    identity: str | None
    num_layers: int | None | Absent = _absent()
    hidden_size: int | None | Absent = _absent()
    vocab_size: int | None | Absent = _absent()
    layer_types: list[str] | None | Absent = _absent()
    dtype: str | None | Absent = _absent()
    device: str | None | Absent = _absent()
    loaded: bool | None = _opt()


@dataclass
class ContextBlock(Row):
    """The settings that change τ (:meth:`dflash_eval.session.eval_session.EvalSession.run_context`;
    :mod:`dflash_eval.metrics.tau_context`), as recorded: the target's identity (null: not known), the generation's
    length, the drafter's block size, the prompt format (``thinking`` null: the template's default), the dtype and
    backend; the HumanEval wrapper (with HumanEval prompts) and the sampling fields (a run at temperature > 0) only
    where they apply."""

    target: str | None | Absent = _absent()
    max_new_tokens: int | None = _opt()
    max_blocks: int | None | Absent = _absent()
    block_size: int | None = _opt()
    chat_template: str | None = _opt()
    thinking: bool | None | Absent = _absent()
    dtype: str | None = _opt()
    backend: str | None = _opt()
    humaneval_wrapper: str | None = _opt()
    temperature: float | None = _opt()
    top_k: int | None = _opt()
    top_p: float | None = _opt()
    min_p: float | None = _opt()
    samples_per_prompt: int | None = _opt()
    sampling_seed: int | None = _opt()


@dataclass
class GitState(Row):
    """The git repository holding the run's working folder (:func:`dflash_eval.common.workdir.git_state`): its HEAD
    commit, whether tracked files differ from it (null: ``git status`` did not answer in time) and its root."""

    commit: str
    dirty: bool | None
    root: str | None = _opt()


@dataclass
class KernelChange(Row):
    """A kernel whose output changed since the cache was made (one of ``provenance.kernel_probe.changed``): the probe's
    (:meth:`dflash_eval.target.kernel_registry.KernelProbes.note_change`, with its ``shape``) or the witness's
    (``first`` ``witness``, with its ``witness`` mismatch): the label, backend and dtype, the digests it was and is
    (null: none), the kernels that moved, the first of them and its kind, what was made again, the message, and a
    witnessed mismatch's τ impact."""

    label: str
    backend: str
    dtype: str
    was: str | None
    now: str | None
    kernels: list[str]
    first: str | None
    kinds: list[str]
    what: str
    message: str
    shape: dict[str, Any] | None = _opt()
    witness: dict[str, Any] | None = _opt()
    tau_impact: str | None = _opt()

    @property
    def by_witness(self) -> bool:
        """The witness noticed it: its message says what the run did."""
        return self.first == "witness"


@dataclass
class KernelProbeBlock(Row):
    """The kernel probe of one process (its seconds, its probes, the kernel changes it noticed; no ``per_worker``)
    or of the run's processes (:meth:`merged`): the slowest process's seconds, each probe once (the layout
    :mod:`dflash_eval.target.kernel_registry` owns), every kernel change any process noticed, the seconds per
    worker."""

    seconds: float | None = field(default=None, metadata=OPTIONAL, kw_only=True)  # first, as the probe writes it
    probes: list[dict[str, Any]]
    changed: list[KernelChange]
    per_worker: dict[str, float] | None = _opt()

    @classmethod
    def merged(cls, blocks: Sequence[tuple[str, KernelProbeBlock]]) -> KernelProbeBlock:
        """The run's kernel probe of each process's (worker, block): each (backend, dtype, probe shape) probe once
        (every process probes its own kernels), each change (label, digest it was) once, the probe time per
        worker."""
        probes: dict[tuple[Any, Any, str], dict[str, Any]] = {}
        changed: dict[tuple[str, str | None], KernelChange] = {}
        for _, b in blocks:
            for p in b.probes:  # the registry's layout: the probe's key fields
                probes.setdefault((p.get("backend"), p.get("dtype"), json.dumps(p.get("shape"), sort_keys=True)), p)
            for c in b.changed:
                changed.setdefault((c.label, c.was), c)
        return cls(seconds=max(b.seconds or 0.0 for _, b in blocks), probes=list(probes.values()),
                   changed=list(changed.values()), per_worker={w: b.seconds or 0.0 for w, b in blocks})


@dataclass
class ProvenanceBlock(Row):
    """What the run ran with (:func:`dflash_eval.target.provenance.provenance` and
    :func:`dflash_eval.common.workdir.run_location`, then the kernel probe and the witness): the backend, dtype,
    device and its kind (null: not known), the library versions (null: not installed), the host, the git state
    (absent outside a repository), the kernel probe and the witness's checks (the layout
    :mod:`dflash_eval.features.witness` owns)."""

    backend: str | None | Absent = _absent()
    dtype: str | None | Absent = _absent()
    device: str | None | Absent = _absent()
    device_kind: str | None | Absent = _absent()
    versions: dict[str, str | None] | None = _opt()
    host: str | None = _opt()
    git: GitState | None = _opt()
    kernel_probe: KernelProbeBlock | None = _opt()
    witness: dict[str, Any] | None = _opt()

    @property
    def kernel_changes(self) -> list[KernelChange]:
        """The kernels the kernel probe or the witness found changed (empty: none, or no probe)."""
        return [] if self.kernel_probe is None else list(self.kernel_probe.changed)
