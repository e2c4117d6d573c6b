# Backend plugins (src/backends/plugin.h): MODULE libraries named libtessera-backend-<name>.so,
# compiled against the backend SDK alone (build/layers/sdk/: the headers cmake/sdk.txt lists and
# core's public headers) and linked without libtessera: the SDK's symbols come from the process
# that loads them.
set(TESSERA_SDK_STAGE ${CMAKE_BINARY_DIR}/layers/sdk)
file(STRINGS ${PROJECT_SOURCE_DIR}/cmake/sdk.txt TESSERA_SDK_HEADERS REGEX "^[a-z]")
set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/sdk.txt)
file(REMOVE_RECURSE ${TESSERA_SDK_STAGE})
foreach(h ${TESSERA_SDK_HEADERS} )
  get_filename_component(dir ${h} DIRECTORY)
  file(MAKE_DIRECTORY ${TESSERA_SDK_STAGE}/${dir})
  file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${h} ${TESSERA_SDK_STAGE}/${h} SYMBOLIC)
  get_filename_component(dest ${h} DIRECTORY)
  install(FILES src/${h} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tessera/sdk/${dest})
endforeach()
file(MAKE_DIRECTORY ${TESSERA_SDK_STAGE}/tessera)
foreach(h dtype.h shape.h error.h device.h scope.h version.h)
  file(CREATE_LINK ${PROJECT_SOURCE_DIR}/include/tessera/${h} ${TESSERA_SDK_STAGE}/tessera/${h} SYMBOLIC)
endforeach()
# For plugins built against an installed Tessera: Tessera::sdk (include/ and include/tessera/sdk/).
add_library(tessera_sdk INTERFACE)
target_include_directories(tessera_sdk INTERFACE $<BUILD_INTERFACE:${TESSERA_SDK_STAGE}>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/tessera/sdk>)
set_target_properties(tessera_sdk PROPERTIES EXPORT_NAME sdk)
install(TARGETS tessera_sdk EXPORT TesseraTargets)

# tessera_add_backend_plugin(<name> <sources>... [OUTPUT_DIRECTORY dir] [NO_INSTALL])
function(tessera_add_backend_plugin name)
  cmake_parse_arguments(P "NO_INSTALL" "OUTPUT_DIRECTORY" "" ${ARGN})
  if(NOT P_OUTPUT_DIRECTORY)
    set(P_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib)  # next to libtessera.so
  endif()
  add_library(tessera_backend_${name} MODULE ${P_UNPARSED_ARGUMENTS})
  target_link_libraries(tessera_backend_${name} PRIVATE tessera_sdk)
  target_compile_options(tessera_backend_${name} PRIVATE ${TESSERA_WARNINGS})
  set_target_properties(tessera_backend_${name} PROPERTIES PREFIX "lib" OUTPUT_NAME tessera-backend-${name}
    LIBRARY_OUTPUT_DIRECTORY ${P_OUTPUT_DIRECTORY} CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  if(NOT P_NO_INSTALL)
    install(TARGETS tessera_backend_${name} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  endif()
endfunction()
