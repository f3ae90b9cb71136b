"""The low-level binding: DLPack without copies (PyTorch and NumPy), strides, errors, the GIL, and
several Python threads at once."""

import threading

import numpy as np
import pytest
import torch

import attnops
import attnops.torch as at

INT32_MAX = 2147483647
# The compressed causal mask torch_npu users pass with sparse modes 2-4 (a None mask means no masking).
CAUSAL = torch.ones(2048, 2048, dtype=torch.bool).triu(1)


def call_fa(q, k, v, out, head_num, layout="BNSD", scale=1.0, **kw):
    args = dict(pse=None, drop_mask=None, atten_mask=None, prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None,
                q_start_idx=None, kv_start_idx=None, sink=None, scale=scale, keep_prob=1.0, pre_tokens=INT32_MAX,
                next_tokens=INT32_MAX, head_num=head_num, input_layout=layout, inner_precise=0, sparse_mode=0,
                pse_type=1, seed=0, offset=0, softmax_max=None, softmax_sum=None)
    args.update(kw)
    attnops.flash_attention_score(q, k, v, attention_out=out, **args)


def test_no_copies_torch_and_numpy():
    t = torch.randn(2, 3, 4)
    assert attnops._data_ptr(t) == t.data_ptr()
    view = t.transpose(0, 2)[1:]
    assert attnops._data_ptr(view) == view.data_ptr()
    a = np.ones((3, 5), dtype=np.float32)
    assert attnops._data_ptr(a) == a.ctypes.data
    assert attnops._data_ptr(a.T) == a.ctypes.data


def test_numpy_arrays_and_strided_outputs():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 5, 8), dtype=np.float32)
    k = rng.standard_normal((1, 2, 6, 8), dtype=np.float32)
    v = rng.standard_normal((1, 2, 6, 8), dtype=np.float32)
    out = np.zeros((1, 2, 5, 8), dtype=np.float32)
    call_fa(q, k, v, out, 2, scale=0.5)
    s = 0.5 * q @ k.transpose(0, 1, 3, 2)
    p = np.exp(s - s.max(-1, keepdims=True))
    expect = (p / p.sum(-1, keepdims=True)) @ v
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-6)
    # The output may itself be a strided view: a BNSD result written into a BSND buffer.
    buf = np.full((1, 5, 2, 8), np.nan, dtype=np.float32)
    call_fa(q, k, v, buf.transpose(0, 2, 1, 3), 2, scale=0.5)
    np.testing.assert_array_equal(buf.transpose(0, 2, 1, 3), out)


def test_strided_torch_inputs_match_contiguous():
    q = torch.randn(2, 6, 3, 16)   # BSND storage, viewed as BNSD
    k = torch.randn(2, 7, 3, 16)
    v = torch.randn(2, 7, 3, 16)
    strided = at.npu_fusion_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 3, "BNSD", scale=0.25)
    contiguous = at.npu_fusion_attention(*(x.transpose(1, 2).contiguous() for x in (q, k, v)), 3, "BNSD", scale=0.25)
    assert torch.equal(strided[0], contiguous[0])


def test_errors_carry_the_library_message():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"ATTNOPS_ERROR_INVALID_ARGUMENT: query.shape = \[1,2,4,8\]: .*headNum = 3"):
        at.npu_fusion_attention(q, q, q, 3, "BNSD")
    with pytest.raises(ValueError, match="keepProb = 0"):
        at.npu_fusion_attention(q, q, q, 2, "BNSD", keep_prob=0.0)
    with pytest.raises(ValueError, match="input_layout"):
        at.npu_fusion_attention(q, q, q, 2, "XYZ")
    with pytest.raises(ValueError, match="negative stride"):
        call_fa(np.ones((1, 1, 4, 8), np.float32)[:, :, ::-1], q.numpy(), q.numpy(), np.zeros((1, 1, 4, 8), np.float32), 1)
    with pytest.raises(ValueError, match="unsupported element type"):
        call_fa(q.to(torch.complex64), q, q, torch.empty(1, 2, 4, 8), 2)
    with pytest.raises(ValueError, match="threads = 0"):
        attnops.set_threads(0)
    # A failure leaves nothing behind: the next call works.
    assert at.npu_fusion_attention(q, q, q, 2, "BNSD")[0].shape == (1, 2, 4, 8)


def test_gil_is_released_while_an_operator_runs():
    q = torch.randn(1, 4, 768, 64)
    ticks = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        counts = []
        for _ in range(3):
            before = ticks[0]
            at.npu_fusion_attention(q, q, q, 4, "BNSD")
            counts.append(ticks[0] - before)
    finally:
        stop.set()
        spinner.join()
    # With the GIL held for the whole call the other thread could not count at all.
    assert max(counts) > 0


def test_python_threads_at_once_give_serial_results():
    gens = [torch.Generator().manual_seed(i) for i in range(6)]
    problems = [tuple(torch.randn(s, generator=g) for s in ((2, 4, 33, 16), (2, 2, 40, 16), (2, 2, 40, 16)))
                for g in gens]
    bar = [tuple(torch.randn(s, generator=g) for s in ((50, 32), (50, 3, 32), (32,), (32,))) for g in gens]

    def work(i):
        q, k, v = (x.clone().requires_grad_() for x in problems[i])
        out = at.npu_fusion_attention(q, k, v, 4, "BNSD", scale=0.25, atten_mask=CAUSAL, sparse_mode=2)[0]
        out.sum().backward()
        pb, br, pw, nw = (x.clone().requires_grad_() for x in bar[i])
        h = at.block_attention_residuals(pb, br, pw, nw)
        h.square().sum().backward()
        return [out.detach(), q.grad, k.grad, v.grad, h.detach(), pb.grad, br.grad, pw.grad, nw.grad]

    serial = [work(i) for i in range(len(problems))]
    results = [None] * (3 * len(problems))
    errors = []

    def runner(slot):
        try:
            results[slot] = work(slot % len(problems))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=runner, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for slot, got in enumerate(results):
        for a, b in zip(got, serial[slot % len(problems)]):
            assert torch.equal(a, b)


def test_thread_count_does_not_change_bits():
    q = torch.randn(2, 4, 70, 32)
    before = attnops.threads()
    try:
        attnops.set_threads(1)
        one = at.npu_fusion_attention(q, q, q, 4, "BNSD", atten_mask=CAUSAL, sparse_mode=2)[0]
        attnops.set_threads(3)
        three = at.npu_fusion_attention(q, q, q, 4, "BNSD", atten_mask=CAUSAL, sparse_mode=2)[0]
    finally:
        attnops.set_threads(before)
    assert torch.equal(one, three)
