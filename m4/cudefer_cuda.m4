# CUDEFER_CHECK_CUDA
# ------------------
# Find the CUDA toolkit: --with-cuda=DIR, else $CUDA_HOME, else /usr/local/cuda.
# Sets and substitutes CUDA_HOME, CUDA_CPPFLAGS, CUDA_LDFLAGS, CUDA_LIBS (the
# shared cudart, with an rpath so programs run without LD_LIBRARY_PATH), NVCC
# and NVCC_ARCH; defines the automake conditional HAVE_NVCC.
AC_DEFUN([CUDEFER_CHECK_CUDA], [
  AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda=DIR],
      [CUDA toolkit directory (default: $CUDA_HOME, then /usr/local/cuda)])],
    [cudefer_cuda_dir=$withval],
    [cudefer_cuda_dir=${CUDA_HOME:-/usr/local/cuda}])
  AS_IF([test "x$cudefer_cuda_dir" = xno || test ! -d "$cudefer_cuda_dir"],
    [AC_MSG_ERROR([cudefer needs the CUDA toolkit: pass --with-cuda=DIR (tried "$cudefer_cuda_dir")])])
  CUDA_HOME=$cudefer_cuda_dir
  cudefer_cuda_libdir=$CUDA_HOME/lib64
  AS_IF([test -d "$cudefer_cuda_libdir"], [], [cudefer_cuda_libdir=$CUDA_HOME/lib])
  CUDA_CPPFLAGS="-I$CUDA_HOME/include"
  CUDA_LDFLAGS="-L$cudefer_cuda_libdir -Wl,-rpath,$cudefer_cuda_libdir"
  CUDA_LIBS="$CUDA_LDFLAGS -lcudart"

  cudefer_save_CPPFLAGS=$CPPFLAGS
  cudefer_save_LIBS=$LIBS
  CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS"
  AC_CHECK_HEADER([cuda_runtime_api.h], [],
    [AC_MSG_ERROR([cudefer needs the CUDA toolkit: pass --with-cuda=DIR (no cuda_runtime_api.h in $CUDA_HOME/include)])])
  LIBS="$CUDA_LIBS $LIBS"
  AC_MSG_CHECKING([for cudaStreamGetDevice in libcudart (CUDA 12.8 or later)])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <cuda_runtime_api.h>]],
      [[int d; return (int)cudaStreamGetDevice((cudaStream_t)0, &d);]])],
    [AC_MSG_RESULT([yes])],
    [AC_MSG_RESULT([no])
     AC_MSG_ERROR([cudefer needs the CUDA toolkit (12.8 or later): pass --with-cuda=DIR (could not link cudart from $cudefer_cuda_libdir)])])
  CPPFLAGS=$cudefer_save_CPPFLAGS
  LIBS=$cudefer_save_LIBS

  AC_PATH_PROG([NVCC], [nvcc], [], [$CUDA_HOME/bin$PATH_SEPARATOR$PATH])
  AC_ARG_VAR([NVCC_ARCH], [nvcc architecture flag for the GPU tests, demo and benchmark (default: -arch=sm_90)])
  : ${NVCC_ARCH="-arch=sm_90"}
  AC_SUBST([CUDA_HOME])
  AC_SUBST([CUDA_CPPFLAGS])
  AC_SUBST([CUDA_LDFLAGS])
  AC_SUBST([CUDA_LIBS])
  AM_CONDITIONAL([HAVE_NVCC], [test -n "$NVCC"])
])
