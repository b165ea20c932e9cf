#!/usr/bin/env bash
# Moves a file larger than one device-tool call can carry (64 MiB in all, with the bundle) to the GPU machine
# in pieces: xz-compresses FILE, splits it into parts under build/gpu_carry/ (ignored by git, so they travel
# only when named in `carry`), and writes a manifest (target path relative to the model dir, sha256 of the
# original). Carry the parts over consecutive calls while the machine is warm, each call copying its part to
# /tmp/stoke_carry/ (what persists between warm calls); then scripts/gpu_check.sh (or `join` below) rebuilds the
# file under $STOKE_MODEL_DIR (default ~/.cache/stoke/models) and checks its sha256.
#
#   scripts/split_for_device.sh ~/.cache/stoke/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \
#       smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf [FIRST_PART_MIB=26] [PART_MIB=58]
#   # on the GPU machine, once every part is in /tmp/stoke_carry:
#   scripts/split_for_device.sh join
#
# The first part is small enough to travel beside the bundle (~34 MiB); the others travel alone.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=/tmp/stoke_carry
if [[ "${1:-}" == "join" ]]; then
  [[ -f "$STAGE/manifest" ]] || { echo "split_for_device: no $STAGE/manifest" >&2; exit 1; }
  read -r rel sha parts < "$STAGE/manifest"
  dest="${STOKE_MODEL_DIR:-$HOME/.cache/stoke/models}/$rel"
  for i in $(seq 0 $((parts - 1))); do
    [[ -f "$STAGE/part.$i" ]] || { echo "split_for_device: part $i of $parts missing in $STAGE" >&2; exit 1; }
  done
  mkdir -p "$(dirname "$dest")"
  for i in $(seq 0 $((parts - 1))); do cat "$STAGE/part.$i"; done |
    python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.LZMAFile(sys.stdin.buffer), sys.stdout.buffer)" > "$dest.tmp"
  got=$(sha256sum "$dest.tmp" | cut -d' ' -f1)
  [[ "$got" == "$sha" ]] || { echo "split_for_device: sha256 $got != $sha" >&2; rm -f "$dest.tmp"; exit 1; }
  mv "$dest.tmp" "$dest"
  echo "split_for_device: $dest ($(stat -c %s "$dest") bytes, sha256 ok)"
  exit 0
fi
FILE=${1:?usage: split_for_device.sh FILE REL_PATH [FIRST_PART_MIB] [PART_MIB] | join}
REL=${2:?usage: split_for_device.sh FILE REL_PATH [FIRST_PART_MIB] [PART_MIB] | join}
FIRST=$(( ${3:-26} * 1048576 ))
PART=$(( ${4:-58} * 1048576 ))
OUTDIR=build/gpu_carry
rm -rf "$OUTDIR" && mkdir -p "$OUTDIR"
echo "split_for_device: compressing $FILE (xz -6)..." >&2
xz -6 -T0 -c "$FILE" > "$OUTDIR/all.xz"
size=$(stat -c %s "$OUTDIR/all.xz")
head -c "$FIRST" "$OUTDIR/all.xz" > "$OUTDIR/part.0"
n=1 off=$FIRST
while (( off < size )); do
  dd if="$OUTDIR/all.xz" of="$OUTDIR/part.$n" bs=1048576 skip=$((off / 1048576)) count=$((PART / 1048576)) \
    status=none
  off=$((off + PART)); n=$((n + 1))
done
rm "$OUTDIR/all.xz"
echo "$REL $(sha256sum "$FILE" | cut -d' ' -f1) $n" > "$OUTDIR/manifest"
echo "split_for_device: $n parts in $OUTDIR (manifest: $(cat "$OUTDIR/manifest"))"
echo "calls (machine warm between them):"
echo "  1: carry [.bundle.tar.gz, $OUTDIR/manifest, $OUTDIR/part.0]; mkdir -p $STAGE && cp $OUTDIR/manifest $OUTDIR/part.0 $STAGE/"
for i in $(seq 1 $((n - 1))); do
  echo "  $((i + 1)): carry [$OUTDIR/part.$i]; mkdir -p $STAGE && cp $OUTDIR/part.$i $STAGE/"
done
echo "  then: scripts/split_for_device.sh join && scripts/gpu_check.sh   (CudaLlamaRealModelTest finds the model)"
