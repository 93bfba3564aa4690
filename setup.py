"""Builds the `edgeinfer` package (from daemon/edgeinfer/) and its native core `edgeinfer._ring` (from native/)."""
from Cython.Build import cythonize
import re

from setuptools import Extension, find_packages, setup

# The version is defined once, in the package (daemon/edgeinfer/support/version.py), read here without importing it.
with open("daemon/edgeinfer/support/version.py") as f:
    VERSION = re.search(r'^VERSION = "([^"]+)"$', f.read(), re.M).group(1)

ring = Extension(
    "edgeinfer._ring",
    sources=["native/ring.pyx"],
    include_dirs=["native/include", "native"],
    depends=["native/include/edgeinfer/ring.h", "native/include/edgeinfer/abi.h", "native/include/edgeinfer/client.h",
             "native/include/edgeinfer/handshake.h", "native/consumer.h", "native/ring_h.pxd", "native/sigbus_guard.h",
             "native/doorbell.h", "native/lanes.h"],
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wno-unused-function"],
)

hist = Extension(
    "edgeinfer._hist",
    sources=["native/hist.pyx"],
    extra_compile_args=["-O2", "-Wall", "-Wno-unused-function"],
)

# A decoder's per-frame arithmetic (the classification top-k), one C call after each inference.
decode = Extension(
    "edgeinfer._decode",
    sources=["native/decode.pyx"],
    extra_compile_args=["-O2", "-Wall", "-Wno-unused-function"],
)

# The lane's hardening (uid, capabilities, no_new_privs, seccomp): links libseccomp (libseccomp-dev to build).
harden = Extension(
    "edgeinfer._harden",
    sources=["native/harden.pyx"],
    include_dirs=["native"],
    depends=["native/harden.h"],
    libraries=["seccomp"],
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wno-unused-function"],
)

setup(
    name="edgeinfer",
    version=VERSION,
    description="Zero-copy, real-time ONNX inference on shared-memory camera frames",
    license="Apache-2.0",
    python_requires=">=3.11",
    packages=find_packages("daemon", include=["edgeinfer", "edgeinfer.*"]),
    package_dir={"": "daemon"},
    ext_modules=cythonize([ring, hist, decode, harden], include_path=["native"],
                          compiler_directives={"language_level": "3"}),
    install_requires=["numpy>=1.26", "onnxruntime>=1.20", "onnx>=1.16", "pyyaml>=6", "pydantic>=2.5", "pillow>=10.1",
                      "model-signing==1.1.1", "pyopenssl>=24", "packaging>=23", "prometheus-client>=0.20",
                      "av>=18.1"],
    entry_points={"console_scripts": ["edgeinferd = edgeinfer.cli.main:edgeinferd_main",
                                      "edgeinferctl = edgeinfer.cli.main:edgeinferctl_main"]},
    zip_safe=False,
)
