# The peers' commits (sourced by export_sources.sh and build.sh; bench_peers.py records them).
# FlashMLA: deepseek-ai/FlashMLA main as of 2026-12 and its csrc/cutlass submodule commit (both of
# its builds: flashmla_dense.so and flashmla_sparse.so).
FLASHMLA_COMMIT=9241ae3ef9bac614dd25e45e507e089f888280e0
FLASHMLA_CUTLASS_COMMIT=147f5673d0c1c3dcf66f78d677fd647e4a020219
# FlashAttention-3: Dao-AILab/flash-attention main (hopper/) as of 2026-12 and its csrc/cutlass
# submodule commit.
FA_COMMIT=0251105a2fb19d2957484b7f023cd8c115286ced
FA_CUTLASS_COMMIT=7127592069c2fe01b041e174ba4345ef9b279671
