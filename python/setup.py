"""The one custom build step of the clattn package: build libclattn with the repository's CMake and
copy the shared library into the package (clattn/_bundled/), so `pip install ./python` gives a
working package on a machine that has CMake, a C compiler and the OpenCL headers (scripts/setup.sh
installs them) but no installed libclattn.

CLATTN_NO_BUILD=1 skips it (the package then loads CLATTN_LIBRARY or a system libclattn);
CLATTN_CMAKE_ARGS adds arguments to the configure step. Without the C sources next to this folder
(an sdist built elsewhere) nothing is bundled and the package says so when it cannot load one.
"""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


class BuildWithLibrary(build_py):
    """build_py, then libclattn built by CMake into <build_lib>/clattn/_bundled/."""

    def run(self):
        super().run()
        if os.environ.get("CLATTN_NO_BUILD") == "1":
            print("clattn: CLATTN_NO_BUILD=1, not bundling libclattn")
            return
        if not (ROOT / "CMakeLists.txt").exists() or not (ROOT / "include" / "clattn.h").exists():
            print(f"clattn: no C sources at {ROOT}; not bundling libclattn (set CLATTN_LIBRARY at run time)")
            return
        cmake = shutil.which("cmake")
        if cmake is None:
            sys.exit("clattn: building the package needs cmake (apt-get install cmake, or set CLATTN_NO_BUILD=1 "
                     "and point CLATTN_LIBRARY at a built libclattn.so)")
        # In the build folder setuptools keeps (python/build/), so a reinstall rebuilds incrementally.
        build_dir = HERE / "build" / f"cmake-{sys.platform}"
        args = [cmake, "-S", str(ROOT), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                "-DCLATTN_BUILD_TOOLS=OFF", "-DBUILD_TESTING=OFF", "-DCLATTN_BUILD_EXAMPLES=OFF",
                # a newer compiler's new warning must not make an install fail
                "-DCLATTN_WERROR=OFF"]
        args += shlex.split(os.environ.get("CLATTN_CMAKE_ARGS", ""))
        subprocess.check_call(args)
        subprocess.check_call([cmake, "--build", str(build_dir), "--target", "clattn",
                               "-j", str(os.cpu_count() or 2)])
        libs = [p for p in build_dir.iterdir()
                if p.name.startswith("libclattn") and (".so" in p.name or p.suffix in (".dylib", ".dll"))
                and not p.is_symlink()]
        if not libs:
            sys.exit(f"clattn: the CMake build made no shared libclattn in {build_dir}")
        dest = Path(self.build_lib) / "clattn" / "_bundled"
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        for lib in libs:  # the real file, under the plain name the loader looks for
            name = "libclattn" + (".so" if ".so" in lib.name else lib.suffix)
            shutil.copy2(lib, dest / name)
            print(f"clattn: bundled {lib} as {dest / name}")


class PlatformDistribution(Distribution):
    """The wheel carries a native library: tag it for this platform, not 'any'."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=PlatformDistribution)
