"""nn.RNN, nn.LSTM and nn.GRU (PyTorch's parameter names, gate order, initialization and
shapes), unrolled over time in tessera ops: the whole sequence is one traced graph, compiled once
per sequence length. The input projections of all time steps are one matmul per layer and
direction; only the recurrent matmul runs per step."""
import math

import tessera
from tessera.nn import init
from tessera.nn.module import Module, Parameter

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


class _RNNBase(Module):
    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__()
        if proj_size:
            raise TypeError(f"tessera.nn.{type(self).__name__}: proj_size is not supported")
        if not 0 <= dropout <= 1:
            raise ValueError("dropout should be a number in range [0, 1]")
        self.mode, self.input_size, self.hidden_size, self.num_layers = mode, input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout, self.bidirectional = bias, batch_first, float(dropout), bidirectional
        f = {"device": device or "cpu", "dtype": dtype or tessera.float32}
        gates, dirs = _GATES[mode] * hidden_size, 2 if bidirectional else 1
        for layer in range(num_layers):
            for d in range(dirs):
                sfx = f"_l{layer}" + ("_reverse" if d else "")
                in_size = input_size if layer == 0 else hidden_size * dirs
                names = [("weight_ih" + sfx, (gates, in_size)), ("weight_hh" + sfx, (gates, hidden_size))]
                if bias:
                    names += [("bias_ih" + sfx, (gates,)), ("bias_hh" + sfx, (gates,))]
                for name, shape in names:
                    setattr(self, name, Parameter(tessera.empty(shape, **f)))
        self.reset_parameters()

    def reset_parameters(self):
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for p in self.parameters():
            init.uniform_(p, -stdv, stdv)

    def _cell(self, gi, h, c, w_hh, b_hh):
        """One step: gi = x_t @ W_ih^T + b_ih (precomputed); returns (h', c')."""
        gh = h.matmul(w_hh.t())
        if b_hh is not None:
            gh = gh + b_hh
        if self.mode == "LSTM":
            i, f, g, o = (gi + gh).chunk(4, -1)
            c = f.sigmoid() * c + i.sigmoid() * g.tanh()
            return o.sigmoid() * c.tanh(), c
        if self.mode == "GRU":
            ir, iz, inn = gi.chunk(3, -1)
            hr, hz, hn = gh.chunk(3, -1)
            r, z = (ir + hr).sigmoid(), (iz + hz).sigmoid()
            n = (inn + r * hn).tanh()
            return (1 - z) * n + z * h, c
        pre = gi + gh
        return (pre.tanh() if self.mode == "RNN_TANH" else pre.relu()), c

    def forward(self, input, hx=None):
        batched = input.dim() == 3
        x = input if batched else input.unsqueeze(1)
        if batched and self.batch_first:
            x = x.transpose(0, 1)  # [T, N, C]
        T, N = x.shape[0], x.shape[1]
        dirs, H = 2 if self.bidirectional else 1, self.hidden_size
        lstm = self.mode == "LSTM"
        if hx is None:
            zeros = tessera.zeros(self.num_layers * dirs, N, H, dtype=x.dtype, device=x.device)
            h0, c0 = zeros, zeros
        else:
            h0, c0 = hx if lstm else (hx, None)
            if not batched:
                h0, c0 = h0.unsqueeze(1), (c0.unsqueeze(1) if c0 is not None else None)
        hs, cs = [], []
        for layer in range(self.num_layers):
            outs = []
            for d in range(dirs):
                sfx = f"_l{layer}" + ("_reverse" if d else "")
                w_ih, w_hh = getattr(self, "weight_ih" + sfx), getattr(self, "weight_hh" + sfx)
                b_ih = getattr(self, "bias_ih" + sfx) if self.bias else None
                b_hh = getattr(self, "bias_hh" + sfx) if self.bias else None
                gi = x.matmul(w_ih.t())
                if b_ih is not None:
                    gi = gi + b_ih
                k = layer * dirs + d
                h, c = h0[k], (c0[k] if lstm else None)
                steps = [None] * T
                for t in (range(T - 1, -1, -1) if d else range(T)):
                    h, c = self._cell(gi[t], h, c, w_hh, b_hh)
                    steps[t] = h
                outs.append(tessera.stack(steps, 0))
                hs.append(h)
                cs.append(c)
            x = outs[0] if dirs == 1 else tessera.cat(outs, -1)
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                x = tessera.nn.functional.dropout(x, self.dropout)
        h_n = tessera.stack(hs, 0)
        out = x
        if batched and self.batch_first:
            out = out.transpose(0, 1)
        if not batched:
            out, h_n = out.squeeze(1), h_n.squeeze(1)
        if lstm:
            c_n = tessera.stack(cs, 0)
            return out, (h_n, c_n if batched else c_n.squeeze(1))
        return out, h_n

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.batch_first:
            s += ", batch_first=True"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s


class RNN(_RNNBase):
    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, device=None, dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'")
        super().__init__("RNN_" + nonlinearity.upper(), input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, device=device, dtype=dtype)


class LSTM(_RNNBase):
    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         proj_size, device, dtype)


class GRU(_RNNBase):
    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, device=None, dtype=None):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         device=device, dtype=dtype)
