// The submodule jax_mla._ext.testing: hooks for tests and benchmarks (testing.cc).
#pragma once

#include <nanobind/nanobind.h>

namespace jax_mla {
namespace python {

void define_testing(nanobind::module_ m);

}  // namespace python
}  // namespace jax_mla
