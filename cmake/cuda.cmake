# The CUDA toolkit, found once for everything that uses it (the cuda backend plugin, the NVRTC
# compile test): TESSERA_HAVE_CUDA_TOOLKIT is ON where CMake's FindCUDAToolkit finds the toolkit
# with NVRTC, and then CUDA::nvrtc, CUDA::cuda_driver, CUDA::cublasLt... are the imported targets.
# Where it is absent the CUDA parts are skipped with this one message (under CI=true the NVRTC
# test then fails instead: tests/CMakeLists.txt); TESSERA_REQUIRE_CUDA_TOOLKIT makes its absence
# a configure error (scripts/gpu-check sets it).
#
# Some machines also carry copies of the toolkit's headers in /usr/local/include, a default
# system directory searched after every -I/-isystem directory: the toolkit's own include
# directory (added by the CUDA:: targets) therefore comes first and those copies never shadow it.
option(TESSERA_CUDA "Build the CUDA parts where the CUDA toolkit is found" ON)
option(TESSERA_REQUIRE_CUDA_TOOLKIT "Fail the configure when the CUDA toolkit is not found" OFF)
set(TESSERA_HAVE_CUDA_TOOLKIT OFF)
if(TESSERA_CUDA)
  if(NOT DEFINED CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND TARGET CUDA::nvrtc)
    set(TESSERA_HAVE_CUDA_TOOLKIT ON)
    message(STATUS "CUDA toolkit ${CUDAToolkit_VERSION} (${CUDAToolkit_BIN_DIR}): building the CUDA parts")
  elseif(TESSERA_REQUIRE_CUDA_TOOLKIT)
    message(FATAL_ERROR "TESSERA_REQUIRE_CUDA_TOOLKIT is ON but no CUDA toolkit with NVRTC was found")
  else()
    message(STATUS "CUDA toolkit not found: the cuda backend and its NVRTC test are skipped")
  endif()
else()
  message(STATUS "TESSERA_CUDA is OFF: the cuda backend and its NVRTC test are skipped")
endif()
