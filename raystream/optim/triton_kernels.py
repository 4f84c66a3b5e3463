"""The Triton kernels of Orthogonal-AdamW's fused step (raystream/optim/triton_step.py launches them): Algorithm 2
in two passes over memory, the least a step can read and write.

    `dots_kernel`    pass 1, reads g and c: (g . c, c . c) of each block of BLOCK elements, fp32
    `segment_kernel` the blocks' partial sums added up per tensor, in a fixed order (deterministic; per_tensor)
    `update_kernel`  pass 2, reads p, g, c, m, v and writes p, c, m, v, element by element:
                         u = g - k c                   (k: the step's projection coefficient, global or per tensor)
                         c = c + w (g - c)             (the EMA of the RAW gradient: w = 1 - orth_beta, or 1 for
                                                        orth_init="first_grad" at its first step)
                         u = -u                        (maximize)
                         p = p (1 - lr wd)
                         m = m + (1 - b1) (u - m)
                         v = b2 v + (1 - b2) u^2
                         p = p - lr / (1 - b1^t) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
                     (and, for the diagnostics, u . u of each block).

11 words a parameter against torch's fused AdamW's 7 (reads g, p, m, v; writes p, m, v). Everything is computed in
fp32 and rounded once, when stored in the tensor's own dtype (the EMA is fp32 for bf16 / fp16 parameters).

One launch covers many tensors: a block table says which tensor each program's block belongs to (`block_tensor`)
and where it starts in it (`block_start`), and offset tables hold where each tensor starts, in elements from a base
tensor of its dtype (`p_base`: the segment's first parameter, for theta, g, m, v; `c_base`: its first EMA). A base is
a kernel argument that Triton knows to be 16-byte aligned; where every tensor is (the host checks), VEC_P / VEC_C
(16 bytes in elements) tell the compiler so, and each thread loads and stores 16 bytes at a time. That also needs
a mask the compiler knows to be constant over each vector: a block wholly inside its tensor (all but a tensor's
last) runs with an all-true mask, the last block with the real one (`_block`, then one of two calls of a body).

Importing this module imports Triton: with TRITON_INTERPRET=1 set before that import, the kernels run on CPU
tensors in Triton's interpreter (the tests do so in a child process).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _block(block_tensor, block_start, numel, b, BLOCK: tl.constexpr):
    """Block b of the table: its tensor's index, the element offsets it covers, the tensor's size and whether the
    block lies wholly inside it."""
    t = tl.load(block_tensor + b)
    start = tl.load(block_start + b)
    n = tl.load(numel + t)
    return t, start + tl.arange(0, BLOCK), n, start + BLOCK <= n


@triton.jit
def _at(off_table, t, offs, VEC: tl.constexpr, BLOCK: tl.constexpr):
    """The element indices of block `offs` of tensor t from its base (runs of BLOCK, each starting at a multiple of
    VEC elements)."""
    return tl.max_contiguous(tl.multiple_of(tl.load(off_table + t) + offs, VEC), BLOCK)


@triton.jit
def _dots(p_base, c_base, g_off, c_off, partial, b, t, offs, mask, VEC_P: tl.constexpr, VEC_C: tl.constexpr,
          BLOCK: tl.constexpr):
    g = tl.load(p_base + _at(g_off, t, offs, VEC_P, BLOCK), mask=mask, other=0.0).to(tl.float32)
    c = tl.load(c_base + _at(c_off, t, offs, VEC_C, BLOCK), mask=mask, other=0.0).to(tl.float32)
    tl.store(partial + 2 * b, tl.sum(g * c, axis=0))
    tl.store(partial + 2 * b + 1, tl.sum(c * c, axis=0))


@triton.jit(do_not_specialize=["block0"])
def dots_kernel(p_base, c_base, g_off, c_off, block_tensor, block_start, numel, partial, block0,
                VEC_P: tl.constexpr, VEC_C: tl.constexpr, BLOCK: tl.constexpr):
    """partial[b] = (g . c, c . c) over block b = block0 + the program's index (fp32)."""
    b = block0 + tl.program_id(0)
    t, offs, n, whole = _block(block_tensor, block_start, numel, b, BLOCK)
    if whole:
        _dots(p_base, c_base, g_off, c_off, partial, b, t, offs, tl.full((BLOCK,), 1, tl.int1), VEC_P, VEC_C, BLOCK)
    else:
        _dots(p_base, c_base, g_off, c_off, partial, b, t, offs, offs < n, VEC_P, VEC_C, BLOCK)


@triton.jit
def segment_kernel(partial, first_block, blocks, out, CHUNK: tl.constexpr):
    """out[t] = the sum of partial[b] over tensor t's blocks (contiguous in the table), always in the same order."""
    t = tl.program_id(0)
    first = tl.load(first_block + t)
    count = tl.load(blocks + t)
    gc = tl.zeros((CHUNK,), dtype=tl.float32)
    cc = tl.zeros((CHUNK,), dtype=tl.float32)
    for i in range(0, count, CHUNK):
        idx = i + tl.arange(0, CHUNK)
        mask = idx < count
        gc += tl.load(partial + 2 * (first + idx), mask=mask, other=0.0)
        cc += tl.load(partial + 2 * (first + idx) + 1, mask=mask, other=0.0)
    tl.store(out + 2 * t, tl.sum(gc, axis=0))
    tl.store(out + 2 * t + 1, tl.sum(cc, axis=0))


@triton.jit
def _update(p_base, c_base, p_off, g_off, c_off, m_off, v_off, uu, b, t, offs, mask, kt, lr_t, bc2_t, decay, beta1,
            beta2, eps, ema_weight, MAXIMIZE: tl.constexpr, WITH_UU: tl.constexpr, VEC_P: tl.constexpr,
            VEC_C: tl.constexpr, BLOCK: tl.constexpr):
    pi = _at(p_off, t, offs, VEC_P, BLOCK)
    ci = _at(c_off, t, offs, VEC_C, BLOCK)
    mi = _at(m_off, t, offs, VEC_P, BLOCK)
    vi = _at(v_off, t, offs, VEC_P, BLOCK)
    g = tl.load(p_base + _at(g_off, t, offs, VEC_P, BLOCK), mask=mask, other=0.0).to(tl.float32)
    c = tl.load(c_base + ci, mask=mask, other=0.0).to(tl.float32)
    u = g - kt * c
    tl.store(c_base + ci, (c + ema_weight * (g - c)).to(c_base.dtype.element_ty), mask=mask)
    if WITH_UU:
        tl.store(uu + b, tl.sum(u * u, axis=0))
    if MAXIMIZE:
        u = -u
    p = tl.load(p_base + pi, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(p_base + mi, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(p_base + vi, mask=mask, other=0.0).to(tl.float32)
    m = m + (1.0 - beta1) * (u - m)
    v = beta2 * v + (1.0 - beta2) * u * u
    p = p * decay - lr_t * m / (tl.sqrt(v) * bc2_t + eps)
    dt = p_base.dtype.element_ty
    tl.store(p_base + mi, m.to(dt), mask=mask)
    tl.store(p_base + vi, v.to(dt), mask=mask)
    tl.store(p_base + pi, p.to(dt), mask=mask)


@triton.jit(do_not_specialize=["block0", "first"])
def update_kernel(p_base, c_base, p_off, g_off, c_off, m_off, v_off, step_size, inv_bc2, block_tensor, block_start,
                  numel, k, uu, block0, first, decay, beta1, beta2, eps, ema_weight,
                  PER_TENSOR: tl.constexpr, MAXIMIZE: tl.constexpr, WITH_UU: tl.constexpr, VEC_P: tl.constexpr,
                  VEC_C: tl.constexpr, BLOCK: tl.constexpr):
    """Pass 2 over block b = block0 + the program's index: projection, EMA, AdamW (the module docstring's lines).
    `step_size` = lr / (1 - b1^t) and `inv_bc2` = 1 / sqrt(1 - b2^t) of tensors first, first + 1, ... (float64,
    computed before); `k`: one coefficient (global) or one per tensor (PER_TENSOR); `uu`: u . u per block
    (WITH_UU)."""
    b = block0 + tl.program_id(0)
    t, offs, n, whole = _block(block_tensor, block_start, numel, b, BLOCK)
    if PER_TENSOR:
        kt = tl.load(k + t)
    else:
        kt = tl.load(k)
    lr_t = tl.load(step_size + (t - first)).to(tl.float32)
    bc2_t = tl.load(inv_bc2 + (t - first)).to(tl.float32)
    if whole:
        _update(p_base, c_base, p_off, g_off, c_off, m_off, v_off, uu, b, t, offs, tl.full((BLOCK,), 1, tl.int1), kt,
                lr_t, bc2_t, decay, beta1, beta2, eps, ema_weight, MAXIMIZE, WITH_UU, VEC_P, VEC_C, BLOCK)
    else:
        _update(p_base, c_base, p_off, g_off, c_off, m_off, v_off, uu, b, t, offs, offs < n, kt, lr_t, bc2_t, decay,
                beta1, beta2, eps, ema_weight, MAXIMIZE, WITH_UU, VEC_P, VEC_C, BLOCK)
