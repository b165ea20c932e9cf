# CUDA is optional: detected when nvcc exists (STOKE_CUDA=AUTO), forced with ON, skipped with OFF.
# Code is compiled for sm_90a (Hopper: wgmma/TMA) plus PTX for compute_90, so it also JITs on newer GPUs.
set(STOKE_HAVE_CUDA OFF)
if(NOT STOKE_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90a-real 90-virtual)
    endif()
    enable_language(CUDA)
    # CMake 3.25 does not know that nvcc 13 speaks C++20: teach it the flag.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA_STANDARD 20)
    find_package(CUDAToolkit REQUIRED)
    set(STOKE_HAVE_CUDA ON)
    message(STATUS "stoke: CUDA backend ON (${CMAKE_CUDA_COMPILER_VERSION}, arch ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(STOKE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "STOKE_CUDA=ON but no CUDA compiler was found")
  else()
    message(STATUS "stoke: CUDA backend OFF (no nvcc)")
  endif()
endif()

# nvJPEG (GPU JPEG decoding, engine/image_cuda/jpeg_decode_gpu.h) is optional: the toolkit on the build machine
# may lack it, so it is also looked for in the pip wheel nvidia-nvjpeg (tests/nvjpeg.txt; scripts/setup.sh
# installs it into .venv: nvidia/cu13/{include/nvjpeg.h,lib/libnvjpeg.so.13}). STOKE_NVJPEG_ROOT points at
# another folder holding include/ and lib/. Found: the imported target stoke::nvjpeg and STOKE_HAVE_NVJPEG ON;
# the binaries then carry the library's folder in their RPATH and scripts/bundle.sh copies it into .bundle/lib.
set(STOKE_HAVE_NVJPEG OFF)
# An optional shared library found by header and library: the imported target `target`, `have_var` ON in the
# caller's scope, and a status line saying which (with `missing`, what its absence turns off).
function(stoke_optional_library target have_var what include_dir library missing)
  if(include_dir AND library)
    add_library(${target} SHARED IMPORTED)
    set_target_properties(${target} PROPERTIES IMPORTED_LOCATION ${library}
                                               INTERFACE_INCLUDE_DIRECTORIES ${include_dir})
    set(${have_var} ON PARENT_SCOPE)
    message(STATUS "stoke: ${what} found (${library})")
  else()
    message(STATUS "stoke: ${what} not found (${missing})")
  endif()
endfunction()

if(STOKE_HAVE_CUDA)
  file(GLOB _stoke_nvjpeg_wheel LIST_DIRECTORIES true
       ${PROJECT_SOURCE_DIR}/.venv/lib/python3*/site-packages/nvidia/cu13)
  set(_stoke_nvjpeg_hints ${STOKE_NVJPEG_ROOT} ${_stoke_nvjpeg_wheel} ${CUDAToolkit_LIBRARY_ROOT})
  find_path(STOKE_NVJPEG_INCLUDE_DIR nvjpeg.h HINTS ${_stoke_nvjpeg_hints} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include NO_DEFAULT_PATH)
  find_library(STOKE_NVJPEG_LIBRARY NAMES nvjpeg libnvjpeg.so.13 HINTS ${_stoke_nvjpeg_hints}
               ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
  stoke_optional_library(stoke::nvjpeg STOKE_HAVE_NVJPEG nvJPEG "${STOKE_NVJPEG_INCLUDE_DIR}"
                         "${STOKE_NVJPEG_LIBRARY}" "GPU JPEG decoding off; scripts/setup.sh installs the \
nvidia-nvjpeg wheel into .venv, or set STOKE_NVJPEG_ROOT")
endif()

# cuDNN (the CNN executor's convolutions, engine/cnn_cuda/cuda_cnn.cc: --conv-backend cudnn) is optional:
# cudnn.h and libcudnn are looked for beside the toolkit (STOKE_CUDNN_ROOT points at another folder holding
# include/ and lib/). Found: the imported target stoke::cudnn and STOKE_HAVE_CUDNN ON (stoke_cnn_cuda then
# compiles with STOKE_WITH_CUDNN). It links by soname (libcudnn.so.9) and is NOT bundled (scripts/bundle.sh:
# hundreds of MiB; GPU hosts have it on the default linker path).
set(STOKE_HAVE_CUDNN OFF)
if(STOKE_HAVE_CUDA)
  find_path(STOKE_CUDNN_INCLUDE_DIR cudnn.h HINTS ${STOKE_CUDNN_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
            ${CUDAToolkit_LIBRARY_ROOT} PATH_SUFFIXES include)
  find_library(STOKE_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 HINTS ${STOKE_CUDNN_ROOT} ${CUDAToolkit_LIBRARY_DIR}
               ${CUDAToolkit_LIBRARY_ROOT} PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
  stoke_optional_library(stoke::cudnn STOKE_HAVE_CUDNN cuDNN "${STOKE_CUDNN_INCLUDE_DIR}"
                         "${STOKE_CUDNN_LIBRARY}" "--conv-backend cudnn off: convolutions run as im2col + \
cuBLAS; set STOKE_CUDNN_ROOT")
endif()
