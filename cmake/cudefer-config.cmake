# SPDX-License-Identifier: MIT
# cudefer's CMake package, installed by make install as
# <libdir>/cmake/cudefer/cudefer-config.cmake:
#
#   find_package(cudefer 0.2 REQUIRED)   # CMAKE_PREFIX_PATH=<prefix>
#   target_link_libraries(app PRIVATE cudefer::cudefer)
#
# cudefer::cudefer is the shared library with its headers (cudefer.h,
# cudefer.hpp) and the CUDA runtime (CUDA::cudart, found with
# find_package(CUDAToolkit)); CMake gives programs built against it an
# RPATH to it, so they start without LD_LIBRARY_PATH.
# cudefer::cudefer_static, where libcudefer.a was installed, is the static
# archive with the CUDA runtime and the threads library it needs.
include(CMakeFindDependencyMacro)
find_dependency(CUDAToolkit)
find_dependency(Threads)

set(cudefer_VERSION "0.2.0")
set(cudefer_INCLUDE_DIR "/usr/local/include")
set(cudefer_LIBRARY_DIR "/usr/local/lib")

if(NOT TARGET cudefer::cudefer)
  add_library(cudefer::cudefer SHARED IMPORTED)
  set_target_properties(cudefer::cudefer PROPERTIES
    IMPORTED_LOCATION "${cudefer_LIBRARY_DIR}/libcudefer.so"
    IMPORTED_SONAME "libcudefer.so.0"
    INTERFACE_INCLUDE_DIRECTORIES "${cudefer_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "CUDA::cudart")
endif()
if(NOT TARGET cudefer::cudefer_static AND
   EXISTS "${cudefer_LIBRARY_DIR}/libcudefer.a")
  add_library(cudefer::cudefer_static STATIC IMPORTED)
  set_target_properties(cudefer::cudefer_static PROPERTIES
    IMPORTED_LOCATION "${cudefer_LIBRARY_DIR}/libcudefer.a"
    INTERFACE_INCLUDE_DIRECTORIES "${cudefer_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "CUDA::cudart;Threads::Threads")
endif()
