"""The self-check's coverage (cuda/runtime/self_check_cases.h): tests/cpu/cpp/self_check_coverage.cc
builds the cases' inputs and schedules exactly as the self-check does and reports which kernel paths
each case reaches; this test requires every path below, so that editing the case table cannot
silently drop one. The paths are those of the SM100 kernel (the reason for the check: it never ran
on hardware) and the SM90 kernel's equivalents:
  - piece boundaries: a CTA with several pieces (q_empty reused, the correction's per-piece o_ready
    arrival) and with three or more (stats_full's second phase); pieces of 1, 2 and more tiles (the
    MMA warp's q_empty commit on either path); a split piece next to whole ones and a bad request
    between good ones in one CTA (per-piece state is reset);
  - the lazy rescale of O (tile max above the reference by more than the slack, on a tile after a
    piece's first), in both alpha slots and in the second row block;
  - 16, 64 and 128 query rows (padding rows, two row blocks); s_q 1 and 4, causal and not;
    pages of 16, 64 and 256 tokens (and 32); a context of 16K+ tokens; invalid page ids (negative and
    one past the cache) whose requests must come out NaN; empty requests and rows with no visible key;
    bf16 and fp16;
  - the FP8 cache, for every candidate that reads it (kernel_select.h kReadsFp8Cache; SM100 does):
    every case runs over it too (REQUIRED_FP8), so that both dequantization paths of the dequantizing
    warps run on values the comparison sees: fast steps (power-of-two, zero and negative scales,
    subnormal e4m3 bytes) and reference steps (an odd scale, a power of two outside fp16's exact range,
    a dead row's NaN in the same warp step as read rows), a NaN byte whose request must come out NaN,
    rows zero-filled past the cache's end, pages of 16, 32, 64 and 256, the rescale path, both dtypes,
    and pages of one token (the sparse decode's view: the producer warp's cp.async gather, FP8 only).
Needs no GPU and no CUDA toolkit; skipped when no C++ compiler is on PATH."""

from __future__ import annotations

import re

import pytest

from host_cpp import build_and_run

REQUIRED = [
    "cta_pieces>=2 (q_empty reuse, per-piece o_ready)",
    "cta_pieces>=3 (stats_full second phase)",
    "cta_alpha_events>=3 (alpha slot second phase)",
    "cta_split_and_whole_pieces",
    "cta_bad_and_good_pieces",
    "piece_of_1_tile", "piece_of_2_tiles", "piece_of_3+_tiles", "piece_of_128+_tiles",
    "split_request_piece",
    "rescale", "rescale_alpha_slot_0", "rescale_alpha_slot_1",
    "rows_16", "rows_64", "rows_128", "padding_rows", "two_row_blocks",
    "heads_16", "heads_64", "heads_128",
    "s_q_1_causal", "s_q_1_noncausal", "s_q_4_causal", "s_q_4_noncausal",
    "page_16", "page_64", "page_256",
    "context>=16K",
    "bad_page_id_negative", "bad_page_id_past_end",
    "empty_request", "rows_without_visible_key", "tail_tile", "whole_last_tile",
    "page_boundary_inside_request",
    "dtype_bfloat16", "dtype_float16",
]

# Required while the SM100 kernel reads the FP8 cache (the report's "reads_fp8 sm100 1").
REQUIRED_FP8 = [
    "fp8_dtype_bfloat16", "fp8_dtype_float16",
    "fp8_page_16", "fp8_page_32", "fp8_page_64", "fp8_page_256",
    "fp8_page_1",  # the sparse decode's one-token pages, which the producer warp gathers
    "fp8_fast_step_bfloat16", "fp8_fast_step_float16",
    "fp8_reference_step_bfloat16", "fp8_reference_step_float16",
    "fp8_reference_step_odd_scale",
    "fp8_reference_step_scale_outside_float16_range (fast in bfloat16)",
    "fp8_reference_step_for_a_dead_row's_NaN",
    "fp8_zero_scale_fast", "fp8_negative_scale_fast", "fp8_subnormal_e4m3_fast",
    "fp8_dead_row_nan_scale", "fp8_dead_row_nan_bytes_under_a_fast_scale",
    "fp8_nan_byte_in_read_row", "fp8_bad_page_id",
    "fp8_rows_past_the_cache_end (zero-filled)",
    "fp8_rescale", "fp8_rescale_alpha_slot_0", "fp8_rescale_alpha_slot_1",
]

# "A few MB" of device memory for the whole check (one allocation, the largest case).
MAX_DEVICE_BYTES = 4 << 20


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    run = build_and_run("self_check_coverage.cc", tmp_path_factory.mktemp("coverage"), flags=("-O2",))
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[-1] == "ok", run.stdout
    return run.stdout


def paths(report):
    return {m.group(1): m.group(2).split() for m in re.finditer(r"^path (.+?): ?(.*)$", report, re.M)}


def reads_fp8(report):
    return {m.group(1): m.group(2) == "1" for m in re.finditer(r"^reads_fp8 (\S+) (\d)$", report, re.M)}


@pytest.mark.parametrize("path", REQUIRED)
def test_every_path_has_a_case(report, path):
    assert paths(report).get(path), f"no self-check case reaches '{path}'\n{report}"


@pytest.mark.parametrize("path", REQUIRED_FP8)
def test_every_fp8_path_has_a_case(report, path):
    if not reads_fp8(report)["sm100"]:
        pytest.skip("the SM100 kernel does not read the FP8 cache")
    assert paths(report).get(path), f"no self-check case over the FP8 cache reaches '{path}'\n{report}"


def test_fp8_cases_run_for_every_candidate_that_reads_fp8(report):
    """The self-check gates auto's use of its candidate for both cache formats (kernel_select.h): a
    candidate that reads the FP8 cache runs every case over it too, after the 16-bit cache."""
    formats = {m.group(1): m.group(2).split() for m in re.finditer(r"^self_check_formats (\S+): (.*)$", report, re.M)}
    readers = reads_fp8(report)
    assert set(formats) == set(readers) == {"sm90", "sm100"}, report
    for kernel, reads in readers.items():
        assert formats[kernel] == (["dense", "fp8"] if reads else ["dense"]), (kernel, formats[kernel])


def test_rescale_is_not_decided_by_rounding(report):
    """Every modelled rescale exceeds the slack by a margin float32 rounding cannot close."""
    margin = float(re.search(r"^min_rescale_margin (\S+)$", report, re.M).group(1))
    assert margin >= 0.5, margin


def test_device_memory_is_a_few_megabytes(report):
    total = int(re.search(r"^device_bytes (\d+)$", report, re.M).group(1))
    assert 0 < total <= MAX_DEVICE_BYTES, total
    for m in re.finditer(r"^case (\S+) bytes (\d+)$", report, re.M):
        assert int(m.group(2)) <= total, m.group(0)
