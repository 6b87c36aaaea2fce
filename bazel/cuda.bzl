"""cuda_objects: compiles .cu files with the local nvcc (no rules_cuda, which needs a download).

Each source becomes one position-independent object file, compiled with the flags CMakeLists.txt
uses (-std=c++17 -O3 --expt-relaxed-constexpr -lineinfo, one -gencode per real architecture, PTX
for the `ptx` virtual architectures, whole-program compilation so no device link step). Put the target in a cc_library's srcs and
link @jax_mla_cuda//:cudart_static next to it.
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

def _cuda_objects_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    contexts = [dep[CcInfo].compilation_context for dep in ctx.attr.deps]
    headers = depset(ctx.files.hdrs, transitive = [c.headers for c in contexts])

    common = [
        "-ccbin",
        cc_toolchain.compiler_executable,
        "-std=c++17",
        "-O3",
        "-DNDEBUG",
        "--expt-relaxed-constexpr",
        "-lineinfo",
        "-Xcompiler=-fPIC",
    ]
    for arch in ctx.attr.archs:
        common.append("--generate-code=arch=compute_{a},code=[sm_{a}]".format(a = arch))
    for arch in ctx.attr.ptx:
        common.append("--generate-code=arch=compute_{a},code=[compute_{a}]".format(a = arch))
    common += ["-D" + d for d in ctx.attr.defines]
    for c in contexts:
        common += ["-D" + d for d in c.defines.to_list()]
    root = ctx.label.workspace_root
    for inc in ctx.attr.includes:
        common.append("-I" + (root + "/" + inc if root else inc))
    for c in contexts:
        for inc in c.includes.to_list() + c.quote_includes.to_list():
            common.append("-I" + inc)
        for inc in c.system_includes.to_list():
            common.append("-isystem=" + inc)
    common += ctx.attr.copts

    objects = []
    for src in ctx.files.srcs:
        stem = src.short_path
        if stem.startswith("../"):  # a source of another repository
            stem = stem[3:]
        obj = ctx.actions.declare_file("_nvcc/{}/{}.pic.o".format(ctx.label.name, stem[:-len(src.extension) - 1]))
        ctx.actions.run(
            executable = ctx.attr.nvcc,
            arguments = common + ["-x", "cu", "-c", src.path, "-o", obj.path],
            inputs = depset([src], transitive = [headers]),
            tools = cc_toolchain.all_files,
            outputs = [obj],
            mnemonic = "NvccCompile",
            progress_message = "nvcc %s (%s)" % (src.short_path, ", ".join(["sm_" + a for a in ctx.attr.archs] +
                                                                          ["compute_" + a for a in ctx.attr.ptx])),
            # nvcc runs the host compiler and its own tools (cicc, ptxas, fatbinary) by absolute
            # path under the toolkit root; PATH is passed for the host compiler's helpers.
            use_default_shell_env = True,
        )
        objects.append(obj)
    return [DefaultInfo(files = depset(objects))]

cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(providers = [CcInfo], doc = "cc_library targets whose headers, includes and defines are used"),
        "includes": attr.string_list(doc = "-I directories, relative to this repository's root"),
        "defines": attr.string_list(),
        "copts": attr.string_list(),
        "archs": attr.string_list(doc = "real architectures, e.g. 90a"),
        "ptx": attr.string_list(doc = "virtual architectures embedded as PTX, e.g. 80"),
        "nvcc": attr.string(doc = "absolute path of nvcc (unused without srcs)"),
        "_cc_toolchain": attr.label(default = Label("@bazel_tools//tools/cpp:current_cc_toolchain")),
    },
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    fragments = ["cpp"],
)
