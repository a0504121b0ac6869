#!/usr/bin/env bash
# Put DMAD Studio in the desktop's application menu: the desktop entry (Exec pointing at the built
# bundle) and the icon under ~/.local/share. Run after `make package`.
set -euo pipefail
cd "$(dirname "$0")/.."
exe="$(pwd)/dist/dmad-studio/dmad-studio"
[ -x "$exe" ] || { echo "install-desktop: no bundle at $exe (run make package first)" >&2; exit 2; }
apps="${XDG_DATA_HOME:-$HOME/.local/share}/applications"
icons="${XDG_DATA_HOME:-$HOME/.local/share}/icons/hicolor/256x256/apps"
mkdir -p "$apps" "$icons"
cp resources/icons/dmad-studio.png "$icons/dmad-studio.png"
sed "s|^Exec=dmad-studio|Exec=$exe|" resources/dmad-studio.desktop > "$apps/dmad-studio.desktop.tmp"
mv "$apps/dmad-studio.desktop.tmp" "$apps/dmad-studio.desktop"
echo "installed $apps/dmad-studio.desktop"
