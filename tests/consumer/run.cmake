# The "consumer" ctest: install the built tree into a scratch prefix; run the installed tools from
# there with no LD_LIBRARY_PATH (their run path must find the library beside them); then build and
# run an outside program (consumer.c) against that prefix three times: through
# find_package(clattn) with clattn::clattn and with clattn::clattn_static, and through pkg-config.
# Any failing step stops with FATAL_ERROR and the step's whole output.
#
#   cmake -DSOURCE_DIR=<clattn source> -DBUILD_DIR=<clattn build> -DWORK_DIR=<scratch>
#         -DC_COMPILER=<cc> -P run.cmake
cmake_minimum_required(VERSION 3.16)

foreach(var SOURCE_DIR BUILD_DIR WORK_DIR C_COMPILER)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run.cmake: -D${var}=... is required")
  endif()
endforeach()

set(prefix "${WORK_DIR}/prefix")
set(consumer_src "${SOURCE_DIR}/tests/consumer")

# run_step(<name> <output variable> COMMAND...): runs the command, fails with its output unless it
# exits 0, and hands stdout + stderr back in <output variable>.
function(run_step name out_var)
  execute_process(COMMAND ${ARGN}
    RESULT_VARIABLE rc
    OUTPUT_VARIABLE out
    ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmdline "${ARGN}")
    message(FATAL_ERROR "consumer: ${name} failed (${rc})\ncommand: ${cmdline}\n"
                        "--- stdout ---\n${out}\n--- stderr ---\n${err}")
  endif()
  message(STATUS "consumer: ${name}: ok")
  set(${out_var} "${out}${err}" PARENT_SCOPE)
endfunction()

# A run of the consumer must say it checked the result, or that there was no device to check on.
function(check_run name output)
  if(output MATCHES "consumer ok")
    message(STATUS "consumer: ${name}: ${output}")
  elseif(output MATCHES "consumer: no device, skipped")
    message(STATUS "consumer: ${name}: ${output}")
  else()
    message(FATAL_ERROR "consumer: ${name} exited 0 without \"consumer ok\":\n${output}")
  endif()
endfunction()

# --- install -------------------------------------------------------------------------------------
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
run_step("install" install_out "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}")

# GNUInstallDirs puts libraries in lib, lib64 or lib/<multiarch>: find them rather than guess.
file(GLOB_RECURSE pc_files "${prefix}/*/clattn.pc")
list(LENGTH pc_files n_pc)
if(NOT n_pc EQUAL 1)
  message(FATAL_ERROR "consumer: expected one installed clattn.pc under ${prefix}, found ${n_pc}: "
                      "${pc_files}\n${install_out}")
endif()
get_filename_component(pc_dir "${pc_files}" DIRECTORY)
get_filename_component(lib_dir "${pc_dir}" DIRECTORY)
file(GLOB shared_libs "${lib_dir}/libclattn.so*" "${lib_dir}/libclattn*.dylib")
if(NOT shared_libs)
  message(FATAL_ERROR "consumer: no shared libclattn next to ${pc_files}\n${install_out}")
endif()
foreach(f include/clattn.h include/clattn_export.h)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "consumer: ${f} was not installed\n${install_out}")
  endif()
endforeach()
set(run_env "LD_LIBRARY_PATH=${lib_dir}:$ENV{LD_LIBRARY_PATH}"
            "DYLD_LIBRARY_PATH=${lib_dir}:$ENV{DYLD_LIBRARY_PATH}")
file(STRINGS "${prefix}/include/clattn.h" version_lines REGEX "#define CLATTN_VERSION_(MAJOR|MINOR|PATCH) ")
set(header_version "")
foreach(line IN LISTS version_lines)
  string(REGEX REPLACE ".* ([0-9]+)$" "\\1" num "${line}")
  list(APPEND header_version "${num}")
endforeach()
string(REPLACE ";" "." header_version "${header_version}")

# --- installed tools -----------------------------------------------------------------------------
# Started from the prefix as a user would, with no library path in the environment: each must load
# the installed library through its own run path. clattn-info runs whole (it only queries the
# devices: milliseconds) and must report the installed version, or find no device (exit 2); the
# others print their help.
file(STRINGS "${BUILD_DIR}/CMakeCache.txt" tools_line REGEX "^CLATTN_BUILD_TOOLS:BOOL=")
file(STRINGS "${BUILD_DIR}/CMakeCache.txt" bindir_line REGEX "^CMAKE_INSTALL_BINDIR:PATH=")
string(REGEX REPLACE "^[^=]*=" "" with_tools "${tools_line}")
string(REGEX REPLACE "^[^=]*=" "" bindir "${bindir_line}")
if(NOT with_tools)
  message(STATUS "consumer: tools: not built (CLATTN_BUILD_TOOLS=OFF), not checked")
elseif(IS_ABSOLUTE "${bindir}")
  message(STATUS "consumer: tools: installed to ${bindir}, outside the prefix, not checked")
else()
  set(no_lib_path "${CMAKE_COMMAND}" -E env --unset=LD_LIBRARY_PATH --unset=DYLD_LIBRARY_PATH)
  foreach(tool clattn-info clattn-bench clattn-tune)
    if(NOT EXISTS "${prefix}/${bindir}/${tool}")
      message(FATAL_ERROR "consumer: ${tool} was not installed into ${prefix}/${bindir}\n${install_out}")
    endif()
  endforeach()
  execute_process(COMMAND ${no_lib_path} "${prefix}/${bindir}/clattn-info"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0 AND out MATCHES "^clattn-info \\(clattn ${header_version}\\)")
    message(STATUS "consumer: installed clattn-info without LD_LIBRARY_PATH: ok (clattn ${header_version})")
  elseif(rc EQUAL 2)
    message(STATUS "consumer: installed clattn-info without LD_LIBRARY_PATH: started, no device (exit 2)")
  else()
    message(FATAL_ERROR "consumer: the installed clattn-info, run without LD_LIBRARY_PATH, exited ${rc} "
                        "(want 0 with \"clattn-info (clattn ${header_version})\" first, or 2: no device)\n"
                        "--- stdout ---\n${out}\n--- stderr ---\n${err}")
  endif()
  foreach(tool clattn-bench clattn-tune)
    run_step("installed ${tool} --help without LD_LIBRARY_PATH" help_out
      ${no_lib_path} "${prefix}/${bindir}/${tool}" --help)
  endforeach()
endif()

# --- find_package --------------------------------------------------------------------------------
# No package registry: the consumer must find clattn in the prefix and nowhere else.
run_step("configure with find_package" configure_out
  "${CMAKE_COMMAND}" -S "${consumer_src}" -B "${WORK_DIR}/build"
  "-DCMAKE_C_COMPILER=${C_COMPILER}" "-DCMAKE_PREFIX_PATH=${prefix}" -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON)
file(STRINGS "${WORK_DIR}/build/CMakeCache.txt" clattn_dir_line REGEX "^clattn_DIR:")
string(REGEX REPLACE "^clattn_DIR:[A-Z]+=" "" clattn_dir "${clattn_dir_line}")
file(REAL_PATH "${prefix}" real_prefix)
if(EXISTS "${clattn_dir}")
  file(REAL_PATH "${clattn_dir}" clattn_dir)
endif()
string(FIND "${clattn_dir}" "${real_prefix}/" at)
if(NOT at EQUAL 0)
  message(FATAL_ERROR "consumer: find_package used ${clattn_dir}, not the package in ${prefix}\n"
                      "${configure_out}")
endif()
run_step("build with find_package" build_out "${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
find_program(consumer_exe consumer PATHS "${WORK_DIR}/build" "${WORK_DIR}/build/Release"
             NO_DEFAULT_PATH)
if(NOT consumer_exe)
  message(FATAL_ERROR "consumer: the build made no consumer executable\n${build_out}")
endif()
run_step("run (find_package)" run_out "${CMAKE_COMMAND}" -E env ${run_env} "${consumer_exe}")
check_run("run (find_package)" "${run_out}")
# clattn::clattn_static: linked without the shared library (run without LD_LIBRARY_PATH).
find_program(consumer_static_exe consumer_static PATHS "${WORK_DIR}/build" "${WORK_DIR}/build/Release"
             NO_DEFAULT_PATH)
if(NOT consumer_static_exe)
  message(FATAL_ERROR "consumer: the build made no consumer_static executable\n${build_out}")
endif()
find_program(LDD_EXE ldd)
if(LDD_EXE)
  run_step("ldd (clattn::clattn_static)" ldd_out "${LDD_EXE}" "${consumer_static_exe}")
  if(ldd_out MATCHES "libclattn")
    message(FATAL_ERROR "consumer: consumer_static loads a shared libclattn:\n${ldd_out}")
  endif()
endif()
run_step("run (clattn::clattn_static)" run_static_out "${consumer_static_exe}")
check_run("run (clattn::clattn_static)" "${run_static_out}")

# --- pkg-config ----------------------------------------------------------------------------------
find_program(PKG_CONFIG_EXE NAMES pkg-config pkgconf)
if(NOT PKG_CONFIG_EXE)
  message(FATAL_ERROR "consumer: pkg-config is not installed; it is needed to check clattn.pc")
endif()
set(pc_env "PKG_CONFIG_PATH=${pc_dir}")
run_step("pkg-config --modversion" pc_version
  "${CMAKE_COMMAND}" -E env ${pc_env} "${PKG_CONFIG_EXE}" --modversion clattn)
string(STRIP "${pc_version}" pc_version)
if(NOT pc_version STREQUAL header_version)
  message(FATAL_ERROR "consumer: clattn.pc says version ${pc_version}, clattn.h says ${header_version}")
endif()
# The .pc file must describe the prefix it was installed into (cmake --install --prefix may differ
# from CMAKE_INSTALL_PREFIX at configure time), not the one the build was configured with.
foreach(pc_var includedir libdir)
  run_step("pkg-config --variable=${pc_var}" pc_value
    "${CMAKE_COMMAND}" -E env ${pc_env} "${PKG_CONFIG_EXE}" --variable=${pc_var} clattn)
  string(STRIP "${pc_value}" pc_value)
  if(EXISTS "${pc_value}")
    file(REAL_PATH "${pc_value}" pc_value_real)
  else()
    set(pc_value_real "${pc_value}")
  endif()
  string(FIND "${pc_value_real}/" "${real_prefix}/" at)
  if(NOT at EQUAL 0)
    file(READ "${pc_files}" pc_text)
    message(FATAL_ERROR "consumer: the installed clattn.pc is not relocatable: its ${pc_var} is "
                        "\"${pc_value}\", outside the install prefix ${prefix} (cmake --install "
                        "--prefix). ${pc_files}:\n${pc_text}")
  endif()
endforeach()
run_step("pkg-config --cflags --libs" pc_flags
  "${CMAKE_COMMAND}" -E env ${pc_env} "${PKG_CONFIG_EXE}" --cflags --libs clattn)
string(STRIP "${pc_flags}" pc_flags)
separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
set(pc_exe "${WORK_DIR}/consumer_pkgconfig")
run_step("build with pkg-config" pc_build_out
  "${C_COMPILER}" -std=c11 -Wall -Wextra -Werror "${consumer_src}/consumer.c" ${pc_flags} -lm
  -o "${pc_exe}")
run_step("run (pkg-config)" pc_run_out "${CMAKE_COMMAND}" -E env ${run_env} "${pc_exe}")
check_run("run (pkg-config)" "${pc_run_out}")
