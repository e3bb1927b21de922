#!/usr/bin/env python3
"""Torch autograd through transformers' torch_recurrent_gated_delta_rule (modeling_qwen3_5.py; its loop
transcribed, in float64, with no initial state) against the engine's forward and hand-written backward
written by delta-rule-torch.ts to the JSON file named on the command line. Prints the largest differences
and relative L2 errors; exits 3 when torch is missing. Not part of npm test."""
import json
import math
import sys

try:
    import torch
except ImportError:
    print('delta_rule_torch.py needs torch (Debian: apt-get install python3-torch)', file=sys.stderr)
    sys.exit(3)

r = json.load(open(sys.argv[1]))
B, T, Hv, Dk, Dv = (r['dims'][k] for k in ('B', 'T', 'Hv', 'Dk', 'Dv'))


def tensor(values, *shape):
    return torch.tensor(values, dtype=torch.float64).reshape(*shape)


def torch_recurrent_gated_delta_rule(query, key, value, g, beta):
    query, key, value, beta, decay = [x.transpose(1, 2).contiguous() for x in (query, key, value, beta, g)]
    query = query / (query.shape[-1] ** 0.5)
    state = torch.zeros(B, Hv, Dk, Dv, dtype=torch.float64)
    out = []
    for i in range(T):
        q_t, k_t, v_t = query[:, :, i], key[:, :, i], value[:, :, i]
        state = state * decay[:, :, i].exp()[..., None, None]
        kv_mem = (state * k_t.unsqueeze(-1)).sum(dim=-2)
        delta = (v_t - kv_mem) * beta[:, :, i].unsqueeze(-1)
        state = state + k_t.unsqueeze(-1) * delta.unsqueeze(-2)
        out.append((state * q_t.unsqueeze(-1)).sum(dim=-2))
    return torch.stack(out, dim=2).transpose(1, 2)


x = r['inputs']
# the engine's q is HF's query after its 1/sqrt(Dk): HF's input is q * sqrt(Dk), and d/dq = d/dquery * sqrt(Dk)
q = (tensor(x['q'], B, T, Hv, Dk) * math.sqrt(Dk)).requires_grad_()
k = tensor(x['k'], B, T, Hv, Dk).requires_grad_()
v = tensor(x['v'], B, T, Hv, Dv).requires_grad_()
beta = tensor(x['beta'], B, T, Hv).requires_grad_()
g = tensor(x['g'], B, T, Hv).requires_grad_()
o = torch_recurrent_gated_delta_rule(q, k, v, g, beta)
print(f'torch {torch.__version__}; B {B}, T {T}, Hv {Hv}, Dk {Dk}, Dv {Dv}')
print(f'forward: max |o_engine - o_torch| {(tensor(r["out"], *o.shape) - o).abs().max().item():.2e}')
(o * tensor(x['seed'], *o.shape)).sum().backward()
want = {'q': q.grad * math.sqrt(Dk), 'k': k.grad, 'v': v.grad, 'beta': beta.grad, 'g': g.grad}
for name, w in want.items():
    got = tensor(r['grads'][name], *w.shape)
    print(
        f'd{name}: max |engine - torch autograd| {(got - w).abs().max().item():.2e} '
        f'(max |grad| {w.abs().max().item():.2f}), relative L2 {((got - w).norm() / w.norm()).item():.2e}'
    )
