"""One drafting primitive: the offline table and the online loop both draft through ``draft_logits``."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from torch import Tensor

from dflash_eval.drafter import DFlashDrafter, block_ids, draft_logits
from dflash_eval.metrics.online_loop import online_generate
from dflash_eval.metrics.tau import draft_table
from dflash_eval.target.head import TargetHead
from dflash_eval.target.hidden_states import LayerCapture, layer_features
from dflash_eval.target.loader import Target


@dataclass
class RecordingHead(TargetHead):
    """A TargetHead that keeps every lm_head output it produces."""

    outputs: list[Tensor] = field(default_factory=list)

    def logits(self, hidden: Tensor) -> Tensor:
        out = super().logits(hidden)
        self.outputs.append(out.detach().clone())
        return out


def test_offline_table_rows_are_draft_logits(tiny_target: Target, tiny_drafter: DFlashDrafter,
                                             tiny_head: TargetHead) -> None:
    cfg = tiny_drafter.config
    seq = torch.arange(3, 40)
    prompt_len = 30
    per = layer_features(tiny_target.model, seq, list(cfg.target_layer_ids))
    feats = torch.cat([per[i] for i in cfg.target_layer_ids], dim=-1)
    vocab = tiny_head.vocab_size
    table = draft_table(tiny_drafter, tiny_head, [(feats, seq, prompt_len)], top_k=vocab, chunk=1)[0]
    with torch.no_grad():
        ctx = tiny_drafter.project_context(feats)[None]
        for s in range(prompt_len, seq.numel() - 1):
            blocks = block_ids(seq[s:s + 1], cfg.block_size, cfg.mask_token_id)[None]
            logp = torch.log_softmax(draft_logits(tiny_drafter, tiny_head, ctx, blocks, torch.tensor([[s]])), dim=-1)
            lp, ids = logp[0, 0].topk(vocab, dim=-1)
            assert torch.equal(table.ids[table.row(s)], ids) and torch.equal(table.logp[table.row(s)], lp), s


def test_online_drafts_are_draft_logits_of_its_context(tiny_target: Target, tiny_drafter: DFlashDrafter,
                                                       tiny_head: TargetHead,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tiny_drafter.config
    head = RecordingHead(embed_tokens=tiny_head.embed_tokens, lm_head=tiny_head.lm_head)
    chunks: list[Tensor] = []  # features of the prefill, then of each round's committed tokens
    real = LayerCapture.features
    monkeypatch.setattr(LayerCapture, "features", lambda self: chunks.append(real(self)) or chunks[-1])
    prompt = list(range(3, 23))
    res = online_generate(tiny_target, tiny_drafter, head, prompt, max_new_tokens=8, backend="torch")
    online = list(head.outputs)
    assert len(online) == res.tau.rounds == len(chunks) - 1
    seq = prompt + res.tokens
    with torch.no_grad():
        ctx = tiny_drafter.project_context(chunks[0][0])[None]
        start = len(prompt)
        for r, acc_len in enumerate(res.tau.accept_lengths):
            blocks = block_ids(torch.tensor([seq[start]]), cfg.block_size, cfg.mask_token_id)[None]
            want = draft_logits(tiny_drafter, head, ctx, blocks, torch.tensor([[start]]))
            assert torch.equal(online[r].float(), want), f"round {r}"
            ctx = torch.cat([ctx, tiny_drafter.project_context(chunks[r + 1][0])[None]], dim=1)
            start += acc_len
