#!/usr/bin/env bash
# Run a command as if this CPU had a smaller instruction set, to test and
# measure the machines we cannot get (docs/machines.md).
#
#   bash scripts/isa-cap.sh LEVEL [--onednn] COMMAND [ARGS...]
#
# LEVEL: native | avx2 | avx512 | avx512_bf16. Each library is capped by its
# own documented switch, and our detection (vllm_duplex.domain.machine) by
# VLLM_DUPLEX_CPU_ISA, so the start-up choices (the LLM's dtype...) are those
# of the smaller machine:
#   MKL_ENABLE_INSTRUCTIONS  Intel MKL (CTranslate2's GEMMs on Intel CPUs)
#   CT2_FORCE_CPU_ISA        CTranslate2's own kernels
#   ONEDNN_MAX_CPU_ISA       oneDNN (CTranslate2 on AMD CPUs; PyTorch's and vLLM's CPU GEMMs)
#   ATEN_CPU_CAPABILITY      PyTorch's vectorized kernels
# --onednn: CTranslate2's GEMMs through oneDNN instead of MKL (CT2_USE_MKL=0),
# as CTranslate2 runs on AMD CPUs: their int8 results differ from MKL's.
# What no switch caps: vLLM's own compiled CPU kernels pick their ISA at build
# time, so an AVX2 machine runs other code there than this one does.
set -euo pipefail
level=${1:?usage: isa-cap.sh native|avx2|avx512|avx512_bf16 [--onednn] COMMAND...}
shift
if [ "${1:-}" = "--onednn" ]; then
  export CT2_USE_MKL=0
  shift
fi
case "$level" in
  native) ;;
  avx2)
    export VLLM_DUPLEX_CPU_ISA=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 CT2_FORCE_CPU_ISA=AVX2 \
      ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 ;;
  avx512)
    export VLLM_DUPLEX_CPU_ISA=avx512 MKL_ENABLE_INSTRUCTIONS=AVX512 CT2_FORCE_CPU_ISA=AVX512 \
      ONEDNN_MAX_CPU_ISA=AVX512_CORE ATEN_CPU_CAPABILITY=avx512 ;;
  avx512_bf16)
    export VLLM_DUPLEX_CPU_ISA=avx512_bf16 MKL_ENABLE_INSTRUCTIONS=AVX512 CT2_FORCE_CPU_ISA=AVX512 \
      ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 ATEN_CPU_CAPABILITY=avx512 ;;
  *) echo "isa-cap.sh: unknown level '$level' (native, avx2, avx512, avx512_bf16)" >&2; exit 2 ;;
esac
exec "$@"
