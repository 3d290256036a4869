# Sourced by the device jobs that take BASE_ABL (h200_ablate.sh, h200_ablate_set.sh, h200_recipe.sh): one check and
# one spelling of the files it layers, so that a misspelled name is refused the same way, before any phase writes.
#   base_abl ME [NAMES...]   -> the array `base` (--config configs/ablations/NAME.yaml ...); a name without its file
#                               prints "ME: BASE_ABL names NAME, not in configs/ablations/" and returns 2
base_abl() {
  local me=$1 n; shift; base=()
  for n in "$@"; do
    [ -e "configs/ablations/$n.yaml" ] || { echo "$me: BASE_ABL names $n, not in configs/ablations/"; return 2; }
    base+=(--config "configs/ablations/$n.yaml")
  done
}
