"""The machine's settings, chosen from what its CPU says (domain/machine.py).

By value: /proc/cpuinfo texts of the kinds of machine this project runs on,
so the choice for each is pinned here whatever machine runs the test."""

from __future__ import annotations

import pytest
from vllm_duplex.domain.machine import Cpu, choose, isa_cap

AVX2_FLAGS = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi1 bmi2"
EPYC_FLAGS = (AVX2_FLAGS + " avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni avx512_bf16"
              " avx512_vbmi")
SAPPHIRE_FLAGS = EPYC_FLAGS + " avx_vnni amx_bf16 amx_tile amx_int8 avx512_fp16"


def cpuinfo(model: str, flags: str, processors: int = 2) -> str:
    return "\n\n".join(f"processor\t: {i}\nmodel name\t: {model}\nflags\t\t: {flags}"
                       for i in range(processors))


def cpu(flags: str, cores: int = 2, env: dict[str, str] | None = None,
        model: str = "AMD EPYC 9B14") -> Cpu:
    return Cpu.parse(cpuinfo(model, flags, cores), tuple(range(cores)), env or {})


def test_an_avx2_machine_without_native_bf16_runs_the_llm_in_float32():
    m = cpu(AVX2_FLAGS, model="Intel(R) Xeon(R) CPU @ 2.20GHz")
    assert m.isa == "avx2" and not m.native_bf16
    chosen = choose(m, {})
    assert chosen.llm_dtype.value == "float32" and chosen.llm_dtype.source == "machine"
    assert chosen.whisper_compute_type.value == "int8"


@pytest.mark.parametrize("flags, isa", [(EPYC_FLAGS, "avx512_bf16"), (SAPPHIRE_FLAGS, "amx")])
def test_a_cpu_with_native_bf16_runs_the_llm_in_bfloat16(flags, isa):
    m = cpu(flags)
    assert m.isa == isa and m.native_bf16
    chosen = choose(m, {})
    assert chosen.llm_dtype.value == "bfloat16"
    assert "avx512_bf16" in str(chosen.llm_dtype.reason)


def test_the_config_and_the_environment_win_over_the_machine():
    chosen = choose(cpu(EPYC_FLAGS), {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}, dtype="float32",
                    compute_type="float32", threads=2)
    assert (chosen.llm_dtype.value, chosen.llm_dtype.source) == ("float32", "config")
    assert (chosen.whisper_compute_type.value, chosen.whisper_compute_type.source) == ("float32", "config")
    assert (chosen.whisper_threads.value, chosen.whisper_threads.source) == (2, "config")
    assert (chosen.vllm_cpu_bind.value, chosen.vllm_cpu_bind.source) == ("0-1", "env")


@pytest.mark.parametrize("cores, llm, whisper", [(1, "0", 1), (2, "1", 1), (4, "2-3", 2),
                                                  (8, "4-7", 4), (64, "32-63", 4)])
def test_the_llm_gets_the_last_half_of_the_cores_and_whisper_the_rest(cores, llm, whisper):
    chosen = choose(cpu(AVX2_FLAGS, cores), {})
    assert chosen.vllm_cpu_bind.value == llm
    assert chosen.whisper_threads.value == whisper


def test_the_cores_are_those_the_process_may_use():
    m = Cpu.parse(cpuinfo("x", AVX2_FLAGS, 16), (3, 4, 5, 9), {})
    assert m.count == 4 and choose(m, {}).vllm_cpu_bind.value == "5,9"


def test_without_int8_kernels_whisper_computes_in_float32():
    chosen = choose(cpu("fpu sse sse2"), {}, compute_types=frozenset({"float32"}))
    assert chosen.whisper_compute_type.value == "float32"


@pytest.mark.parametrize("env", [{"VLLM_DUPLEX_CPU_ISA": "avx2"}, {"ONEDNN_MAX_CPU_ISA": "AVX2"}])
def test_a_cap_makes_a_bigger_machine_choose_as_a_smaller_one(env):
    m = cpu(SAPPHIRE_FLAGS, env=env)
    assert m.isa == "avx2" and not m.native_bf16 and m.cap == "avx2"
    assert "amx_bf16" not in m.flags and "sse4_2" in m.flags  # only levelled flags go
    assert choose(m, {}).llm_dtype.value == "float32"
    assert "capped at avx2" in m.summary()


def test_a_cap_at_bf16_keeps_bf16_and_drops_amx():
    m = cpu(SAPPHIRE_FLAGS, env={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"})
    assert m.isa == "avx512_bf16" and m.native_bf16 and "amx_tile" not in m.flags


def test_an_unknown_cap_is_an_error_not_an_uncapped_machine():
    with pytest.raises(ValueError, match="unknown ISA level 'avx3'"):
        isa_cap({"VLLM_DUPLEX_CPU_ISA": "avx3"})


def test_the_summary_names_the_cpu_its_cores_and_extensions():
    line = cpu(EPYC_FLAGS).summary()
    assert line == "AMD EPYC 9B14, 2 cores, avx512_bf16 (avx2 avx512f avx512_vnni avx512_bf16)"
    assert cpu(AVX2_FLAGS, 1).summary().endswith("1 core, avx2 (avx2)")


def test_arm_reports_its_arch_and_its_bf16():
    m = Cpu.parse("model name: Neoverse-V2\nFeatures: fp asimd sve bf16 i8mm", (0, 1), {},
                  arch="aarch64")
    assert m.isa == "aarch64" and m.native_bf16
    assert choose(m, {}).llm_dtype.value == "bfloat16"
