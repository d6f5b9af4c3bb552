"""Bad input to the paged attention functions: each gets its own test and a clear exception
that names the argument, the value and what was expected. Validation runs before any
arithmetic, so a wrong table can never produce a plausible-looking wrong answer."""

from __future__ import annotations

import numpy as np
import pytest

from minipaged.paged.paged_attention import gather_kv, paged_attention, paged_prefill_attention

NB, HKV, BS, D, H = 64, 2, 16, 8, 4


def setup(S=2, dtype=np.float32):
    rng = np.random.default_rng(0)
    kc = rng.standard_normal((NB, HKV, BS, D)).astype(dtype)
    vc = rng.standard_normal((NB, HKV, BS, D)).astype(dtype)
    q = rng.standard_normal((S, H, D)).astype(dtype)
    tables = np.full((S, 4), -1, np.int32)
    tables[0, :2] = [5, 9]
    tables[1, :4] = [1, 2, 3, 4]
    lens = np.array([20, 57], np.int32)[:S]
    return q, kc, vc, tables, lens


def test_valid_setup_runs():
    assert paged_attention(*setup()).shape == (2, H, D)


def test_block_table_entry_out_of_range():
    q, kc, vc, bt, lens = setup()
    bt[1, 3] = 99
    with pytest.raises(ValueError, match=r"^block_tables\[1, 3\] = 99 is out of range "
                                         r"\[0, NB=64\) inside seq_lens\[1\]=57"):
        paged_attention(q, kc, vc, bt, lens)


def test_negative_block_table_entry():
    q, kc, vc, bt, lens = setup()
    bt[0, 0] = -5
    with pytest.raises(ValueError, match=r"block_tables\[0, 0\] = -5 is out of range"):
        paged_attention(q, kc, vc, bt, lens, method="online")


def test_padding_entry_inside_length():
    q, kc, vc, bt, lens = setup()
    bt[1, 2] = -1
    with pytest.raises(ValueError, match=r"block_tables\[1, 2\] = -1 is padding \(-1\) inside "
                                         r"seq_lens\[1\]=57 \(logical block 2 holds tokens 32..47"):
        paged_attention(q, kc, vc, bt, lens)


def test_entries_past_the_length_are_not_checked():
    q, kc, vc, bt, lens = setup()
    bt[0, 2:] = [10**6, -42]                     # sequence 0 uses 2 blocks: padding is ignored
    assert np.array_equal(paged_attention(q, kc, vc, bt, lens), paged_attention(*setup()))


def test_seq_len_larger_than_table():
    q, kc, vc, bt, lens = setup()
    lens[1] = 65
    with pytest.raises(ValueError, match=r"seq_lens\[1\]=65 needs 5 blocks of BS=16 but "
                                         r"block_tables has only MB=4 entries per row"):
        paged_attention(q, kc, vc, bt, lens)


def test_seq_len_zero():
    q, kc, vc, bt, lens = setup()
    lens[0] = 0
    with pytest.raises(ValueError, match=r"seq_lens\[0\]=0; every sequence needs at least 1"):
        paged_attention(q, kc, vc, bt, lens)


def test_head_size_mismatch():
    q, kc, vc, bt, lens = setup()
    with pytest.raises(ValueError, match=r"query.shape\[2\]=4 is the head size; key_cache has D=8"):
        paged_attention(q[:, :, :4].copy(), kc, vc, bt, lens)


def test_query_dtype_differs_from_cache():
    q, kc, vc, bt, lens = setup()
    with pytest.raises(TypeError, match=r"query.dtype=float64 != key_cache.dtype=float32"):
        paged_attention(q.astype(np.float64), kc, vc, bt, lens)


def test_key_and_value_cache_dtypes_differ():
    q, kc, vc, bt, lens = setup()
    with pytest.raises(TypeError, match=r"key_cache.dtype=float32 != value_cache.dtype=float64"):
        paged_attention(q, kc, vc.astype(np.float64), bt, lens)


def test_key_and_value_cache_shapes_differ():
    q, kc, vc, bt, lens = setup()
    with pytest.raises(ValueError, match=r"key_cache.shape=\(64, 2, 16, 8\) != "
                                         r"value_cache.shape=\(32, 2, 16, 8\)"):
        paged_attention(q, kc, vc[:32].copy(), bt, lens)


def test_unsupported_cache_dtype():
    q, kc, vc, bt, lens = setup()
    with pytest.raises(TypeError, match=r"key_cache.dtype=int32 is not supported"):
        paged_attention(q, kc.astype(np.int32), vc.astype(np.int32), bt, lens)


def test_heads_not_multiple_of_kv_heads():
    q, kc, vc, bt, lens = setup()
    with pytest.raises(ValueError, match=r"H=3 query heads is not a multiple of Hkv=2"):
        paged_attention(q[:, :3].copy(), kc, vc, bt, lens)


def test_float_block_tables():
    q, kc, vc, bt, lens = setup()
    with pytest.raises(TypeError, match=r"block_tables must hold integers .*got dtype float64"):
        paged_attention(q, kc, vc, bt.astype(np.float64), lens)


def test_float_seq_lens():
    q, kc, vc, bt, lens = setup()
    with pytest.raises(TypeError, match=r"seq_lens must hold integers .*got dtype float32"):
        paged_attention(q, kc, vc, bt, lens.astype(np.float32))


def test_table_rows_differ_from_batch():
    q, kc, vc, bt, lens = setup()
    with pytest.raises(ValueError, match=r"block_tables.shape=\(1, 4\) has 1 rows; expected one "
                                         r"per sequence, S=2"):
        paged_attention(q, kc, vc, bt[:1], lens)


def test_seq_lens_shape():
    q, kc, vc, bt, lens = setup()
    with pytest.raises(ValueError, match=r"seq_lens.shape=\(1,\); expected \[S=2\]"):
        paged_attention(q, kc, vc, bt, lens[:1])


def test_block_tables_rank():
    q, kc, vc, bt, lens = setup()
    with pytest.raises(ValueError, match=r"block_tables must be 2-D, got shape \(8,\)"):
        paged_attention(q, kc, vc, bt.ravel(), lens)


def test_cache_rank():
    q, kc, vc, bt, lens = setup()
    with pytest.raises(ValueError, match=r"key_cache must be \[NB, Hkv, BS, D\] \(4-D\)"):
        paged_attention(q, kc[0], vc[0], bt, lens)


def test_cache_not_contiguous():
    q, kc, vc, bt, lens = setup()
    with pytest.raises(ValueError, match=r"value_cache must be C-contiguous"):
        paged_attention(q, kc, np.asfortranarray(vc), bt, lens)


def test_query_rank():
    q, kc, vc, bt, lens = setup()
    with pytest.raises(ValueError, match=r"query must be \[S, H, D\] \(3-D\), got shape \(2, 32\)"):
        paged_attention(q.reshape(2, -1), kc, vc, bt, lens)


def test_unknown_method():
    with pytest.raises(ValueError, match=r"method='flash'; expected one of \('gather', 'online'\)"):
        paged_attention(*setup(), method="flash")


def test_bad_scale():
    with pytest.raises(ValueError, match=r"scale=nan must be None"):
        paged_attention(*setup(), scale=float("nan"))


# ------------------------------------------------------------------------------ prefill


def prefill_setup():
    q, kc, vc, bt, lens = setup()
    qlens = np.array([3, 5], np.int32)
    qp = np.random.default_rng(1).standard_normal((8, H, D)).astype(np.float32)
    return qp, kc, vc, bt, lens, qlens


def test_prefill_valid_setup_runs():
    assert paged_prefill_attention(*prefill_setup()).shape == (8, H, D)


def test_prefill_rows_differ_from_query_lens():
    qp, kc, vc, bt, lens, qlens = prefill_setup()
    with pytest.raises(ValueError, match=r"query.shape\[0\]=7; expected T=sum\(query_lens\)=8"):
        paged_prefill_attention(qp[:7], kc, vc, bt, lens, qlens)


def test_prefill_query_len_zero():
    qp, kc, vc, bt, lens, qlens = prefill_setup()
    qlens[1] = 0
    with pytest.raises(ValueError, match=r"query_lens\[1\]=0; every sequence needs at least 1"):
        paged_prefill_attention(qp[:3], kc, vc, bt, lens, qlens)


def test_prefill_query_len_beyond_seq_len():
    qp, kc, vc, bt, lens, qlens = prefill_setup()
    lens[0] = 2
    with pytest.raises(ValueError, match=r"query_lens\[0\]=3 > seq_lens\[0\]=2; seq_lens must "
                                         r"count the new tokens"):
        paged_prefill_attention(qp, kc, vc, bt, lens, qlens)


def test_prefill_float_query_lens():
    qp, kc, vc, bt, lens, qlens = prefill_setup()
    with pytest.raises(TypeError, match=r"query_lens must hold integers"):
        paged_prefill_attention(qp, kc, vc, bt, lens, qlens.astype(float))


def test_prefill_bad_table_entry():
    qp, kc, vc, bt, lens, qlens = prefill_setup()
    bt[0, 1] = NB
    with pytest.raises(ValueError, match=r"block_tables\[0, 1\] = 64 is out of range"):
        paged_prefill_attention(qp, kc, vc, bt, lens, qlens, method="online")


# ---------------------------------------------------------------------------- gather_kv


def test_gather_kv_bad_entry_names_the_row():
    _, kc, vc, bt, _ = setup()
    with pytest.raises(ValueError, match=r"block_table_row\[2\] = -1 is padding \(-1\) inside "
                                         r"seq_len=40"):
        gather_kv(kc, vc, bt[0], 40)


def test_gather_kv_seq_len_zero():
    _, kc, vc, bt, _ = setup()
    with pytest.raises(ValueError, match=r"seq_len=0; every sequence needs at least 1 token"):
        gather_kv(kc, vc, bt[0], 0)


def test_gather_kv_float_row():
    _, kc, vc, bt, _ = setup()
    with pytest.raises(TypeError, match=r"block_table_row must hold integers"):
        gather_kv(kc, vc, bt[0].astype(np.float32), 3)


def test_unpadded_block_tables_name_the_argument():
    """Rows of different lengths were NumPy's "inhomogeneous shape" error, naming nothing."""
    q, kc, vc, _, lens = setup()
    with pytest.raises(ValueError, match=r"block_tables=\[\[5, 9\], \[1, 2, 3, 4\]\] has rows "
                                         "of different lengths"):
        paged_attention(q, kc, vc, [[5, 9], [1, 2, 3, 4]], lens)
