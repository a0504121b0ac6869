# make package: the one-folder Linux bundle dist/dmad-studio/ (PyInstaller), then its self-test.
# make install-desktop: a desktop entry and icon for the bundle in ~/.local/share.
.PHONY: package install-desktop

package:
	packaging/build.sh

install-desktop:
	packaging/install-desktop.sh
