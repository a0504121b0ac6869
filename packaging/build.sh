#!/usr/bin/env bash
# Build the one-folder bundle dist/dmad-studio/ (PyInstaller) and run its self-test.
# Usage: packaging/build.sh   (or: make package). Needs the project installed in the active
# environment (pip install torch==2.13.0 -e .); installs PyInstaller if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import PyInstaller" 2>/dev/null || pip install "pyinstaller>=6.10,<7"
start=$(date +%s)
python -m PyInstaller --noconfirm --clean --log-level WARN --distpath dist --workpath build/pyinstaller \
    packaging/dmad_studio.spec
end=$(date +%s)
echo "built dist/dmad-studio in $((end - start)) s, $(du -sh dist/dmad-studio | cut -f1)"
QT_QPA_PLATFORM=offscreen dist/dmad-studio/dmad-studio --self-test
