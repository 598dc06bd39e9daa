# The tiermoe Python extension (tiermoe._core), included by the top-level
# CMakeLists.txt when TIERMOE_PYTHON is on. nanobind is found through the
# interpreter CMake finds (Python_EXECUTABLE): it is a build requirement of
# the package (pyproject.toml) and is in `make test`'s venv. torch is not
# needed to build: tensors cross as DLPack.
find_package(Python 3.9 REQUIRED COMPONENTS Interpreter Development.Module)
execute_process(COMMAND "${Python_EXECUTABLE}" -m nanobind --cmake_dir
  OUTPUT_VARIABLE nanobind_ROOT OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE nanobind_missing)
if(nanobind_missing)
  message(FATAL_ERROR "TIERMOE_PYTHON=ON, but ${Python_EXECUTABLE} cannot import nanobind: "
    "run `${Python_EXECUTABLE} -m pip install nanobind`, or pass -DPython_EXECUTABLE=...")
endif()
find_package(nanobind CONFIG REQUIRED)

file(GLOB py_srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/python/src/*.cpp)
nanobind_add_module(_core NB_STATIC ${py_srcs})
target_link_libraries(_core PRIVATE tiermoe_train tiermoe_io nlohmann_json::nlohmann_json)
target_include_directories(_core PRIVATE ${PROJECT_SOURCE_DIR}/python/src)

if(SKBUILD)
  # The wheel: the extension inside the package, and the CLI beside it,
  # which the `tiermoe` console entry point (tiermoe/_cli.py) runs.
  install(TARGETS _core LIBRARY DESTINATION tiermoe)
  install(TARGETS tiermoe RUNTIME DESTINATION tiermoe/bin)
else()
  # A complete package in the build tree (PYTHONPATH=build/python): the
  # sources linked in, the extension and the CLI beside them.
  set(py_pkg ${PROJECT_BINARY_DIR}/python/tiermoe)
  set_target_properties(_core PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${py_pkg})
  file(MAKE_DIRECTORY ${py_pkg}/bin)
  file(GLOB py_files CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/python/tiermoe/*.py)
  foreach(f ${py_files})
    get_filename_component(n ${f} NAME)
    file(CREATE_LINK ${f} ${py_pkg}/${n} SYMBOLIC)
  endforeach()
  add_custom_command(TARGET tiermoe POST_BUILD
    COMMAND ${CMAKE_COMMAND} -E create_symlink $<TARGET_FILE:tiermoe> ${py_pkg}/bin/tiermoe)
endif()

# tests/python, one ctest entry per file (label python), run by the same
# interpreter against the package in the build tree.
if(TIERMOE_TESTS AND NOT SKBUILD)
  file(GLOB py_tests CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/python/test_*.py)
  foreach(t ${py_tests})
    get_filename_component(n ${t} NAME_WE)
    add_test(NAME python.${n}
      COMMAND ${Python_EXECUTABLE} -m pytest -q -p no:cacheprovider ${t}
      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}/tests/python)
    set_tests_properties(python.${n} PROPERTIES LABELS python TIMEOUT 1200
      ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python:${PROJECT_SOURCE_DIR}/tests/python;TIERMOE_CLI=$<TARGET_FILE:tiermoe>")
  endforeach()
endif()
