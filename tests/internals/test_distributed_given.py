"""The distributed check's local numbers from gradients a caller already read (the watch's): the same
numbers as when the check reads them itself, in any order of names, and read afresh where the names
leave a parameter out."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inspector.distributed.check import local_step
from inspector.runfiles.record import PER_RANK, PER_TENSOR


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.mid = nn.Linear(3, 3)
        self.frozen = nn.Linear(3, 3)
        self.head = nn.Linear(3, 5, bias=False)
        self.head.weight = self.emb.weight
        self.frozen.requires_grad_(False)
        self.register_buffer("scale", torch.tensor([2.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.frozen(self.mid(self.emb(x))) * self.scale)


def _same(a, b) -> bool:
    """The per-tensor numbers and hashes of two local steps are equal (the per-rank memory read moves)."""
    n = len(a.plan.tensors) * PER_TENSOR
    tail = n + PER_RANK
    return torch.equal(a.packed[:n], b.packed[:n]) and torch.equal(a.packed[tail:], b.packed[tail:])


def _model() -> _Tied:
    torch.manual_seed(0)
    m = _Tied()
    m(torch.tensor([[0, 1, 4]])).pow(2).sum().backward()
    return m


@pytest.mark.parametrize("order", ["as named", "reversed"])
def test_given_gradients_give_the_numbers_the_check_reads_itself(order):
    m = _model()
    names = [n for n, _ in m.named_parameters()]
    if order == "reversed":
        names = names[::-1]
    params = dict(m.named_parameters())
    grads = [params[n].grad for n in names]
    norms = torch.stack([g.norm() if g is not None else torch.zeros(()) for g in grads]).double()
    read = local_step(m, 3, grad_norms=(names, norms))
    given = local_step(m, 3, grad_norms=(names, norms), grads=grads)
    assert _same(read, given)
    # the frozen layer has no gradient: its column says so (what a wrong pick would get wrong)
    plan_names = [name for name, _, _ in given.plan.tensors]
    stats = given.packed[: len(plan_names) * PER_TENSOR].reshape(len(plan_names), PER_TENSOR)
    assert stats[plan_names.index("frozen.weight"), 4] == 0.0
    assert stats[plan_names.index("mid.weight"), 4] == 1.0


def test_given_gradients_in_another_order_than_named_are_not_taken_by_position():
    m = _model()
    names = [n for n, _ in m.named_parameters()]
    norms = torch.zeros(len(names), dtype=torch.float64)
    shuffled = [p.grad for _, p in m.named_parameters()][::-1]  # the wrong order for these names
    right = local_step(m, 0, grad_norms=(names, norms), grads=[p.grad for _, p in m.named_parameters()])
    wrong = local_step(m, 0, grad_norms=(names, norms), grads=shuffled)
    assert not _same(right, wrong)  # the given list is what is read


def test_names_that_leave_a_parameter_out_read_the_gradients_afresh():
    m = _model()
    names = [n for n, _ in m.named_parameters()][1:]  # one parameter left out
    params = dict(m.named_parameters())
    grads = [None for _ in names]  # would say "no gradient" everywhere if it were taken
    norms = torch.stack([params[n].grad.norm() if params[n].grad is not None else torch.zeros(())
                         for n in names]).double()
    given = local_step(m, 0, grad_norms=(names, norms), grads=grads)
    read = local_step(m, 0, grad_norms=(names, norms))
    assert _same(read, given)


def test_one_parameter_is_taken_as_a_list_of_one():
    torch.manual_seed(0)
    m = nn.Linear(2, 1, bias=False)
    m(torch.ones(1, 2)).sum().backward()
    norms = m.weight.grad.norm().reshape(1).double()
    given = local_step(m, 0, grad_norms=(["weight"], norms), grads=[m.weight.grad])
    read = local_step(m, 0, grad_norms=(["weight"], norms))
    assert _same(read, given)
    assert not _same(read, local_step(m, 0, grad_norms=(["weight"], norms), grads=[None]))
