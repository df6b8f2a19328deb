# A fake libnvidia-ml (tests/fake_nvml.cpp) to exercise the monitor's run-time NVML loading.
add_library(ember_fake_nvml SHARED ${CMAKE_CURRENT_SOURCE_DIR}/fake_nvml.cpp)
add_dependencies(test_device_monitor ember_fake_nvml)
target_compile_definitions(test_device_monitor PRIVATE EMBER_FAKE_NVML="$<TARGET_FILE:ember_fake_nvml>")
target_link_libraries(test_device_monitor PRIVATE ${CMAKE_DL_LIBS})
