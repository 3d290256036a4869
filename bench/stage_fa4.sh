#!/usr/bin/env bash
# FlashAttention-4 (issue 34: the `fa4` backend of kernels/attention.py) onto the lent H200, which has no
# network: the wheels are downloaded here, carried in two calls, reassembled and installed there.
#
#   bash bench/stage_fa4.sh prepare [DIR]   here, once (CPU machine, repo root; DIR default .stage/fa4, ignored
#                                           by git): downloads the pins of requirements-gpu.txt for Python 3.12,
#                                           --no-deps, plus protobuf (the cutlass DSL needs it; the probe ran
#                                           without bringing it, so it is a spare) and the SmolLM2 tokenizer as an
#                                           HF folder (bench/agent_rollout.py --tokenizer), then lays them out:
#       DIR/c1  cu13.whl.part00 (45 MiB of the 92 MB nvidia-cutlass-dsl-libs-cu13 wheel) + apache-tvm-ffi,
#               nvidia-cutlass-dsl-libs-base, -libs-core                           ~52.6 MiB
#       DIR/c2  cu13.whl.part01 (the other 42.7 MiB), cu13.sha256 + flash-attn-4, nvidia-cutlass-dsl,
#               quack-kernels, torch-c-dlpack-ext, protobuf, tok/ (the tokenizer)   ~48.5 MiB
#     Parts of 45 MiB, not 60: a call carries at most 64 MiB *including* the working tree (~8 MiB).
#   bash bench/stage_fa4.sh part1 [DIR]     there, call 1, carry ["DIR/c1"]: keeps c1 in /root/stage/fa4
#   bash bench/stage_fa4.sh install [DIR]   there, call 2 (within 30 s of call 1: the machine must stay warm),
#                                           carry ["DIR/c2"]: joins the parts, checks the sha256, installs every
#                                           wheel with pip --no-index --no-deps --target /tmp/fa4, makes every
#                                           python3 of the machine add /tmp/fa4 with site.addsitedir (a .pth file:
#                                           the cutlass DSL finds its packages through a .pth of its own, which
#                                           PYTHONPATH alone would not run), copies tok/ to /root/stage/fa4/tok,
#                                           and checks that kernels.attention picks fa4 on this GPU.
#   DRY=1 bash bench/stage_fa4.sh part1|install [DIR]   here: the same steps into /tmp/fa4-dry (pip with
#                                           --python-version 3.12 --platform manylinux_2_28_x86_64, no site edit,
#                                           no import check): the parts join and the wheel set installs whole.
set -eu
MODE=${1:?usage: bench/stage_fa4.sh prepare|part1|install [DIR]}
D=${2:-.stage/fa4}
KEEP=/root/stage/fa4; SITE=/tmp/fa4
if [ -n "${DRY:-}" ]; then KEEP=/tmp/fa4-dry/stage; SITE=/tmp/fa4-dry/site; fi
CU13=nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl

case $MODE in
prepare)
  mkdir -p "$D/c1" "$D/c2" "$D/all"
  for spec in $(grep -v '^#' "$(dirname "$0")/../requirements-gpu.txt" | cut -d' ' -f1 | grep '==') protobuf; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d "$D/all" "$spec"
  done
  (cd "$D/all" && sha256sum "$CU13" > ../c2/cu13.sha256 && split -b 45M -d "$CU13" cu13.whl.part)
  mv "$D/all/cu13.whl.part00" "$D/c1/"; mv "$D/all/cu13.whl.part01" "$D/c2/"
  cp "$D"/all/apache_tvm_ffi-*.whl "$D"/all/nvidia_cutlass_dsl_libs_base-*.whl "$D"/all/nvidia_cutlass_dsl_libs_core-*.whl "$D/c1/"
  cp "$D"/all/flash_attn_4-*.whl "$D"/all/nvidia_cutlass_dsl-4*.whl "$D"/all/quack_kernels-*.whl \
     "$D"/all/torch_c_dlpack_ext-*.whl "$D"/all/protobuf-*.whl "$D/c2/"
  python3 -c "from r1.tokenizer import load_tokenizer; load_tokenizer('smollm2-135m-instruct').hf.save_pretrained('$D/c2/tok')"
  du -sh "$D/c1" "$D/c2"
  ;;
part1)
  mkdir -p "$KEEP" && cp "$D"/c1/* "$KEEP/" && ls -la "$KEEP"
  ;;
install)
  cp -r "$D"/c2/* "$KEEP/"
  cd "$KEEP"
  cat cu13.whl.part00 cu13.whl.part01 > "$CU13" && sha256sum -c cu13.sha256 && rm cu13.whl.part0*
  if [ -n "${DRY:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" --python-version 3.12 \
      --only-binary=:all: --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --implementation cp ./*.whl
    ls "$SITE"; exit 0
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" ./*.whl
  SP=$(python3 -c 'import site; print(site.getsitepackages()[0])')
  echo "import site; site.addsitedir('$SITE')" > "$SP/zz_r1_fa4.pth"
  cd - > /dev/null
  python3 - <<'PY'
import torch
from importlib.metadata import version
import flash_attn.cute  # noqa: F401
from kernels import attention as A
q = torch.empty(1, 16, 128, device="cuda", dtype=torch.bfloat16)
print("flash-attn-4", version("flash-attn-4"), "cutlass-dsl", version("nvidia-cutlass-dsl"), "torch", torch.__version__,
      torch.cuda.get_device_name(), "backend:", A.pick_backend(q))
assert A.pick_backend(q) == "fa4", A.fa4_refusal(q)
PY
  ;;
*) echo "unknown mode $MODE"; exit 2 ;;
esac
