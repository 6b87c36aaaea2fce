# The peers' commits and the PEERS selection (sourced by export_sources.sh and build.sh;
# bench_peers.py records the commits).
# FlashMLA: deepseek-ai/FlashMLA main as of 2026-12 and its csrc/cutlass submodule commit (both of
# its builds: flashmla_dense.so and flashmla_sparse.so).
FLASHMLA_COMMIT=9241ae3ef9bac614dd25e45e507e089f888280e0
FLASHMLA_CUTLASS_COMMIT=147f5673d0c1c3dcf66f78d677fd647e4a020219
# FlashAttention-3: Dao-AILab/flash-attention main (hopper/) as of 2026-12 and its csrc/cutlass
# submodule commit.
FA_COMMIT=0251105a2fb19d2957484b7f023cd8c115286ced
FA_CUTLASS_COMMIT=7127592069c2fe01b041e174ba4345ef9b279671
# PEERS: the peers to export or build (default all three); want NAME: whether NAME is one of them.
PEERS=${PEERS:-dense fa3 sparse}
want() { case " $PEERS " in *" $1 "*) return 0 ;; esac; return 1; }
for p in $PEERS; do
  case "$p" in dense|fa3|sparse) ;; *) echo "PEERS: unknown peer $p (dense, fa3, sparse)" >&2; exit 2 ;; esac
done
