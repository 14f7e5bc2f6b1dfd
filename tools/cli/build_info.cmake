# Writes OUT (a header with the library version and the git revision of the source tree) at
# every build, touching it only when its text changes. Run by the cpuattn_build_info target:
#   cmake -DSRC=<source dir> -DOUT=<header> -DVERSION=<x.y.z> -P build_info.cmake
execute_process(COMMAND git -C "${SRC}" describe --always --dirty --abbrev=12
                OUTPUT_VARIABLE rev OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR rev STREQUAL "")
  set(rev "unknown")  # a source tree without git (a tarball)
endif()
set(text "#pragma once\n#define CPUATTN_VERSION_STRING \"${VERSION}\"\n#define CPUATTN_GIT_REVISION \"${rev}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
  if(old STREQUAL text)
    return()
  endif()
endif()
file(WRITE "${OUT}" "${text}")
