"""Repository rules for jax-mla's Bazel build: everything comes from the local machine, no download.

  @jax_mla_python  the Python interpreter's headers and extension suffix, nanobind's sources (the
                   pip-installed nanobind package) and the XLA FFI headers (the pip-installed
                   jaxlib's include dir), all found by running that interpreter once.
  @jax_mla_cuda    nvcc and the static CUDA runtime of the local CUDA toolkit, or a CPU-only stub.

Call jax_mla_dependencies() from the WORKSPACE (see the top-level WORKSPACE file).

Environment (pass with --repo_env=NAME=value, or export it before running bazel):
  JAX_MLA_PYTHON              interpreter to query (default: python3 on PATH). It needs nanobind
                              and jaxlib installed; jaxlib 0.10.2 gives the FFI ABI floor.
  JAX_MLA_NANOBIND_DIR        nanobind package directory (default: from the interpreter)
  JAX_MLA_XLA_FFI_INCLUDE_DIR directory holding xla/ffi/api/ffi.h (default: jaxlib's include dir)
  JAX_MLA_CUDA                AUTO (default: CUDA kernels when nvcc is found), ON (fail without
                              nvcc) or OFF (CPU only): the same switch as the CMake build.
  JAX_MLA_CUDA_ARCHS          e.g. "80;90a;100a" (default: 80, 90a, 100a, 103a with nvcc >= 12.9 and
                              120 with nvcc >= 12.8); which kernel each gets: CMakeLists.txt
  JAX_MLA_CUDA_PTX            virtual architectures embedded as PTX for the portable and shared
                              kernels (default "80"; "" for none)
  CUDA_PATH, CUDA_HOME        toolkit root (default: the toolkit of nvcc on PATH)
"""

# The FFI ABI floor (pyproject.toml pins the same jaxlib for the wheel build): a handler built
# against newer headers is refused by an older jaxlib.
JAXLIB_FFI_FLOOR = "0.10.2"

_PY_QUERY = """
import importlib.metadata as md, importlib.util as iu, os, sys, sysconfig
def out(k, v): print(k + "=" + str(v))
out("python_version", "%d.%d" % sys.version_info[:2])
out("python_include", sysconfig.get_paths()["include"])
out("ext_suffix", sysconfig.get_config_var("EXT_SUFFIX"))
for name in ("nanobind", "jaxlib"):
    spec = iu.find_spec(name)
    out(name + "_dir", os.path.dirname(os.path.abspath(spec.origin)) if spec and spec.origin else "")
    try:
        out(name + "_version", md.version(name))
    except md.PackageNotFoundError:
        out(name + "_version", "")
"""

def _kv(text):
    res = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep:
            res[k.strip()] = v.strip()
    return res

def _find_python(rctx):
    python = rctx.os.environ.get("JAX_MLA_PYTHON", "") or "python3"
    if "/" not in python:
        found = rctx.which(python)
        if not found:
            fail("jax_mla: '%s' not found on PATH; set JAX_MLA_PYTHON (--repo_env=JAX_MLA_PYTHON=...)" % python)
        python = str(found)
    return python

def _python_impl(rctx):
    python = _find_python(rctx)
    res = rctx.execute([python, "-c", _PY_QUERY])
    if res.return_code != 0:
        fail("jax_mla: running %s failed:\n%s" % (python, res.stderr))
    info = _kv(res.stdout)

    # nanobind is needed for the extension module only: without it the FFI library still builds,
    # and a target that needs nanobind fails with this message.
    nb_dir = rctx.os.environ.get("JAX_MLA_NANOBIND_DIR", "") or info["nanobind_dir"]
    if not nb_dir or not rctx.path(nb_dir + "/src/nb_combined.cpp").exists:
        nb_dir = None
    ffi_dir = rctx.os.environ.get("JAX_MLA_XLA_FFI_INCLUDE_DIR", "")
    if not ffi_dir:
        if not info["jaxlib_dir"]:
            fail("jax_mla: jaxlib not found for %s (its include dir has the XLA FFI headers): " % python +
                 "pip install jaxlib==%s, or set JAX_MLA_XLA_FFI_INCLUDE_DIR" % JAXLIB_FFI_FLOOR)
        ffi_dir = info["jaxlib_dir"] + "/include"
        if info["jaxlib_version"] != JAXLIB_FFI_FLOOR:
            print(("jax_mla: WARNING: XLA FFI headers from jaxlib %s, not %s: the handlers will be " +
                   "refused by jaxlib releases older than %s") % (
                info["jaxlib_version"], JAXLIB_FFI_FLOOR, info["jaxlib_version"]))
    if not rctx.path(ffi_dir + "/xla/ffi/api/c_api.h").exists:
        fail("jax_mla: %s/xla/ffi/api/c_api.h not found" % ffi_dir)

    rctx.symlink(info["python_include"], "python_include")
    rctx.symlink(ffi_dir + "/xla/ffi/api", "xla_ffi/xla/ffi/api")

    nb_srcs = []
    if nb_dir:
        rctx.symlink(nb_dir, "nanobind")

        # nb_combined.cpp #includes the rest of libnanobind; compile the same files one by one
        # (the list differs between nanobind versions; lines indented after '#' are conditional,
        # e.g. the free-threading file).
        for line in rctx.read(nb_dir + "/src/nb_combined.cpp").splitlines():
            if line.startswith('#include "') and line.endswith('.cpp"'):
                nb_srcs.append("nanobind/src/" + line[len('#include "'):-1])
        if not nb_srcs:
            fail("jax_mla: no sources listed in %s/src/nb_combined.cpp" % nb_dir)
        nanobind = _NANOBIND_BUILD.format(nb_srcs = repr(nb_srcs))
    else:
        nanobind = _NO_NANOBIND_BUILD.format(python = python)

    rctx.file("BUILD.bazel", """\
# Generated by //bazel:repositories.bzl from {python}
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "python_headers",
    hdrs = glob(["python_include/**/*.h"]),
    includes = ["python_include"],
)

cc_library(
    name = "xla_ffi_headers",
    hdrs = glob(["xla_ffi/xla/ffi/api/*.h"]),
    includes = ["xla_ffi"],
)
""".format(python = python) + nanobind)

    rctx.file("defs.bzl", """\
# Generated by //bazel:repositories.bzl
PYTHON = {python}
PYTHON_VERSION = {pyver}
EXT_SUFFIX = {suffix}
NANOBIND_VERSION = {nbver}
JAXLIB_VERSION = {jlver}
XLA_FFI_INCLUDE_DIR = {ffi}
""".format(
        python = repr(python),
        pyver = repr(info["python_version"]),
        suffix = repr(info["ext_suffix"]),
        nbver = repr(info["nanobind_version"] if nb_dir else ""),
        jlver = repr(info["jaxlib_version"]),
        ffi = repr(ffi_dir),
    ))

_NANOBIND_BUILD = """
# libnanobind, linked statically into the extension (CMake: nanobind_add_module(... NB_STATIC)).
cc_library(
    name = "nanobind",
    srcs = {nb_srcs} + glob(["nanobind/src/*.h"]),
    hdrs = glob(["nanobind/include/**/*.h", "nanobind/ext/robin_map/include/**/*.h"]),
    includes = ["nanobind/include", "nanobind/ext/robin_map/include"],
    copts = [
        "-std=c++17", "-O3", "-fPIC", "-fvisibility=hidden", "-fno-strict-aliasing",
        "-ffunction-sections", "-fdata-sections", "-fno-stack-protector",
    ],
    local_defines = ["NB_BUILD", "NB_COMPACT_ASSERTIONS", "NDEBUG"],
    deps = [":python_headers"],
)
"""

_NO_NANOBIND_BUILD = """
# nanobind was not found for {python}: only the Python extension needs it.
genrule(
    name = "nanobind_missing",
    outs = ["nanobind_missing.cc"],
    cmd = "echo 'jax_mla: nanobind not found for {python}: pip install nanobind, or set " +
          "JAX_MLA_NANOBIND_DIR (needed for the extension module only)' >&2; exit 1",
)

cc_library(
    name = "nanobind",
    srcs = [":nanobind_missing"],
)
"""

jax_mla_python_repository = repository_rule(
    implementation = _python_impl,
    environ = ["JAX_MLA_PYTHON", "JAX_MLA_NANOBIND_DIR", "JAX_MLA_XLA_FFI_INCLUDE_DIR", "PATH"],
    local = True,
)

def _nvcc_root(rctx, nvcc):
    """The toolkit root, as nvcc itself sees it (nvcc on PATH may be a wrapper script)."""
    rctx.file("empty.cu", "")
    res = rctx.execute([nvcc, "--dryrun", "-c", "empty.cu", "-o", "empty.o"])
    for line in (res.stdout + "\n" + res.stderr).splitlines():
        if line.startswith("#$ TOP="):
            return str(rctx.path(line[len("#$ TOP="):].strip()).realpath)
    fail("jax_mla: cannot find the CUDA toolkit root from '%s --dryrun':\n%s" % (nvcc, res.stderr))

def _cuda_impl(rctx):
    mode = (rctx.os.environ.get("JAX_MLA_CUDA", "") or "AUTO").upper()
    if mode not in ["AUTO", "ON", "OFF", "TRUE", "FALSE", "1", "0"]:
        fail("jax_mla: JAX_MLA_CUDA must be AUTO, ON or OFF (got '%s')" % mode)
    nvcc = None
    if mode not in ["OFF", "FALSE", "0"]:
        for var in ["CUDA_PATH", "CUDA_HOME"]:
            root = rctx.os.environ.get(var, "")
            if root and rctx.path(root + "/bin/nvcc").exists:
                nvcc = root + "/bin/nvcc"
                break
        if not nvcc:
            found = rctx.which("nvcc")
            nvcc = str(found) if found else None
        if not nvcc and mode != "AUTO":
            fail("jax_mla: JAX_MLA_CUDA=%s but nvcc was not found (PATH, CUDA_PATH, CUDA_HOME)" % mode)

    if not nvcc:
        rctx.file("BUILD.bazel", """\
# Generated by //bazel:repositories.bzl: no CUDA (JAX_MLA_CUDA={mode}, or no nvcc found)
package(default_visibility = ["//visibility:public"])
cc_library(name = "cudart_static")
""".format(mode = mode))
        rctx.file("defs.bzl", "HAS_CUDA = False\nNVCC = ''\nCUDA_VERSION = ''\nCUDA_ROOT = ''\nCUDA_ARCHS = []\n" +
                              "SM90_ARCHS = []\nSM100_ARCHS = []\nPORTABLE_ARCHS = []\nSHARED_ARCHS = []\nPTX_ARCHS = []\n")
        return

    root = _nvcc_root(rctx, nvcc)
    nvcc = root + "/bin/nvcc"
    res = rctx.execute([nvcc, "--version"])
    version = ""
    for word in res.stdout.replace(",", " ").split(" "):
        if version == "release":
            version = word
            break
        if word == "release":
            version = "release"
    if not version or version == "release":
        fail("jax_mla: cannot parse '%s --version':\n%s" % (nvcc, res.stdout))
    major, minor = [int(x) for x in version.split(".")[:2]]

    archs = rctx.os.environ.get("JAX_MLA_CUDA_ARCHS", "")
    if archs:
        archs = [a.strip().replace("-real", "") for a in archs.replace(",", ";").split(";") if a.strip()]
    else:
        # CMakeLists.txt's defaults: sm_80 (portable kernel, every 8.x GPU), the arch-specific
        # targets of the SM90 / SM100 kernels (wgmma / setmaxnreg exist only in sm_90a, tcgen05
        # only in sm_100a / sm_103a), and sm_120 for the portable kernel on 12.x.
        archs = ["80", "90a", "100a"]
        if major > 12 or (major == 12 and minor >= 9):  # B300; nvcc >= 12.9
            archs.append("103a")
        if major > 12 or (major == 12 and minor >= 8):  # RTX 50xx; nvcc >= 12.8
            archs.append("120")
    ptx = rctx.os.environ.get("JAX_MLA_CUDA_PTX", "80")
    ptx = [a.strip() for a in ptx.replace(",", ";").split(";") if a.strip()]

    # The same split as CMakeLists.txt: which kernel family is compiled for which architecture.
    sm90, sm100, portable, shared = [], [], [], []
    for a in archs:
        if a.endswith("a"):
            if a == "90a":
                sm90.append(a)
                portable.append("90")
            elif a in ["100a", "103a"]:
                sm100.append(a)
        else:
            portable.append(a)
        if a not in shared:
            shared.append(a)
    if not portable and not ptx:
        fail("jax_mla: JAX_MLA_CUDA_ARCHS / JAX_MLA_CUDA_PTX give the portable kernel no architecture")

    lib = None
    for d in ["lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"]:
        if rctx.path(root + "/" + d + "/libcudart_static.a").exists:
            lib = root + "/" + d + "/libcudart_static.a"
            break
    if not lib:
        fail("jax_mla: libcudart_static.a not found under %s" % root)
    rctx.symlink(lib, "lib/libcudart_static.a")

    rctx.file("BUILD.bazel", """\
# Generated by //bazel:repositories.bzl from {nvcc} (CUDA {version})
package(default_visibility = ["//visibility:public"])

# Static CUDA runtime (CMake: CUDA_RUNTIME_LIBRARY Static): the module loads on machines without
# a CUDA driver. libcuda is never linked; it is dlopen()ed by cudart at first use.
cc_library(
    name = "cudart_static",
    srcs = ["lib/libcudart_static.a"],
    linkopts = ["-ldl", "-lpthread", "-lrt"],
)
""".format(nvcc = nvcc, version = version))
    rctx.file("defs.bzl", """\
# Generated by //bazel:repositories.bzl
HAS_CUDA = True
NVCC = {nvcc}
CUDA_ROOT = {root}
CUDA_VERSION = {version}
CUDA_ARCHS = {archs}
SM90_ARCHS = {sm90}
SM100_ARCHS = {sm100}
PORTABLE_ARCHS = {portable}
SHARED_ARCHS = {shared}
PTX_ARCHS = {ptx}
""".format(nvcc = repr(nvcc), root = repr(root), version = repr(version), archs = repr(archs),
           sm90 = repr(sm90), sm100 = repr(sm100), portable = repr(portable), shared = repr(shared), ptx = repr(ptx)))

jax_mla_cuda_repository = repository_rule(
    implementation = _cuda_impl,
    environ = ["JAX_MLA_CUDA", "JAX_MLA_CUDA_ARCHS", "JAX_MLA_CUDA_PTX", "CUDA_PATH", "CUDA_HOME", "PATH"],
    local = True,
)

def jax_mla_dependencies():
    """Declares @jax_mla_python and @jax_mla_cuda (call from the WORKSPACE)."""
    jax_mla_python_repository(name = "jax_mla_python")
    jax_mla_cuda_repository(name = "jax_mla_cuda")

def jax_mla_bazel4_offline_shims():
    """Bazel 4 and 5 load @rules_cc and @rules_java from their own built-in BUILD files (the C++
    and Java toolchains), and every test rule depends on @remote_coverage_tools; all three are
    downloaded. Offline, as with Debian's bazel-bootstrap (4.2.3), bazel/shims provides the first
    two as thin aliases of the native rules, which is all those BUILD files use, and the coverage
    tools as stubs (`bazel coverage` is then unavailable). Other Bazel versions are left alone.
    Only valid in jax-mla's own WORKSPACE (the paths are relative to it)."""
    version = native.bazel_version or ""
    if version == "" or version.startswith("4.") or version.startswith("5."):
        native.local_repository(name = "rules_cc", path = "bazel/shims/rules_cc")
        native.local_repository(name = "rules_java", path = "bazel/shims/rules_java")
        native.local_repository(name = "remote_coverage_tools", path = "bazel/shims/remote_coverage_tools")
