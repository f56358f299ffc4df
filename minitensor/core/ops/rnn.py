"""One GRU layer over a whole sequence, ``GRUSequence``, with backpropagation through time.

The layers that own the weights are ``nn.GRU`` and ``nn.GRUCell`` (``nn/rnn.py``, which also
explains this GRU variant). With X_t (batch, input_size), H_{t-1} (batch, h), gates stacked
in the order r, z, n:

    R_t  = sigmoid(X_t W_ir^T + b_ir + H_{t-1} W_hr^T + b_hr)             reset gate
    Z_t  = sigmoid(X_t W_iz^T + b_iz + H_{t-1} W_hz^T + b_hz)             update gate
    N_t  = tanh(X_t W_in^T + b_in + R_t * (H_{t-1} W_hn^T + b_hn))        candidate state
    H_t  = Z_t * H_{t-1} + (1 - Z_t) * N_t

The inputs' share of the gates, X_t W_ih^T + b_ih, does not depend on H, so the layer
computes it for all steps in one matrix product and passes it in as ``gates_x``. What is left
-- T dependent steps -- runs inside this one Function: a few array operations per step,
forward and backward, instead of a graph node per operation and a gradient per node.
PyTorch has no functional form of a GRU layer, so there is no ``ops.gru``; ``nn.GRU`` calls
``GRUSequence.apply`` directly.
"""

from __future__ import annotations

from typing import Any

from ..autograd import Function, Grads
from ..tensor import Array


def _sigmoid(xp: Any, a: Array) -> Array:
    return 0.5 * (1 + xp.tanh(0.5 * a))  # = 1 / (1 + e^-a), without overflowing e^-a


class GRUSequence(Function):
    """One GRU layer over a whole sequence, given the inputs' share of the gates.

    Inputs: ``gates_x`` (T, batch, 3h) = X_t W_ih^T + b_ih for every step t, parts [r | z | n];
    ``H0`` (batch, h); ``W_hh`` (3h, h); ``b_hh`` (3h,) or None.
    Output: H_1 .. H_T, (T, batch, h). The last state is ``output[-1]``.

    Backward (backpropagation through time), from the last step to the first. dH is the
    gradient reaching H_t: from the output at t and from step t + 1. With a_n the argument
    of tanh, a_r and a_z those of the sigmoids, and G = H_{t-1} W_hh^T + b_hh = [G_r | G_z | G_n]:

        dN = dH (1 - Z)        dZ = dH (H_{t-1} - N)        from H_t = N + Z (H_{t-1} - N)
        da_n = dN (1 - N^2)    da_z = dZ Z (1 - Z)           tanh' and sigmoid'
        da_r = da_n G_n R (1 - R)                            through R * G_n
        dgates_x_t = [da_r | da_z | da_n]                    (a_* = gates_x_t + G, or R * G_n)
        dG_t       = [da_r | da_z | da_n R]
        dH_{t-1}   = dH Z + dG_t W_hh                        the two paths from H_{t-1}

    and, summed over the steps, dW_hh = sum_t dG_t^T H_{t-1}, db_hh = sum_t dG_t (done as one
    matrix product after the loop).
    """

    @staticmethod
    def forward(ctx: Function, gates_x: Array, H0: Array, W_hh: Array, b_hh: Array) -> Array:
        xp, matmul = ctx.xp, ctx.backend.matmul  # the backend's products: its precision, its graphs
        steps, h = gates_x.shape[0], H0.shape[-1]
        outputs = xp.empty((steps,) + H0.shape, dtype=H0.dtype)
        R_all, Z_all, N_all, G_n_all = (xp.empty_like(outputs) for _ in range(4))
        H = H0
        for t in range(steps):
            G = matmul(H, W_hh.T)  # (batch, 3h): H_{t-1}'s share of all three gates
            if b_hh is not None:
                G = G + b_hh
            gx = gates_x[t]
            RZ = _sigmoid(xp, gx[:, : 2 * h] + G[:, : 2 * h])
            R, Z = RZ[:, :h], RZ[:, h:]
            N = xp.tanh(gx[:, 2 * h :] + R * G[:, 2 * h :])
            H = N + Z * (H - N)  # = Z H_{t-1} + (1 - Z) N, one product fewer
            outputs[t], R_all[t], Z_all[t], N_all[t], G_n_all[t] = H, R, Z, N, G[:, 2 * h :]
        ctx.save_for_backward(H0, outputs, R_all, Z_all, N_all, G_n_all, W_hh)
        ctx.has_bias = b_hh is not None
        return outputs

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        xp, matmul = ctx.xp, ctx.backend.matmul
        H0, outputs, R_all, Z_all, N_all, G_n_all, W_hh = ctx.saved
        steps, batch, h = outputs.shape
        d_gates_x = xp.empty((steps, batch, 3 * h), dtype=grad.dtype)
        d_G = xp.empty_like(d_gates_x)
        dH = xp.zeros_like(H0)  # nothing reaches H_T from a later step
        for t in reversed(range(steps)):
            H_prev = outputs[t - 1] if t > 0 else H0
            R, Z, N = R_all[t], Z_all[t], N_all[t]
            dH = dH + grad[t]
            da_n = dH * (1 - Z) * (1 - N * N)
            da_z = dH * (H_prev - N) * Z * (1 - Z)
            da_r = da_n * G_n_all[t] * R * (1 - R)
            d_gates_x[t, :, :h], d_gates_x[t, :, h : 2 * h], d_gates_x[t, :, 2 * h :] = da_r, da_z, da_n
            d_G[t, :, :h], d_G[t, :, h : 2 * h], d_G[t, :, 2 * h :] = da_r, da_z, da_n * R
            dH = dH * Z + matmul(d_G[t], W_hh)
        H_prevs = xp.concatenate([H0[None], outputs[:-1]]).reshape(-1, h)  # H_0 .. H_{T-1}
        d_G = d_G.reshape(-1, 3 * h)
        d_W_hh = matmul(d_G.T, H_prevs)
        d_b_hh = d_G.sum(axis=0) if ctx.has_bias else None
        return d_gates_x, dH, d_W_hh, d_b_hh
