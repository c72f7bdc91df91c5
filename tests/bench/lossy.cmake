# lossy_bench: throughput and ratio of the lossy tensor codec (JSON output).
add_executable(lossy_bench ${CMAKE_CURRENT_LIST_DIR}/lossy_bench.cc)
target_link_libraries(lossy_bench PRIVATE gpu codec ckptfs_warnings)
target_compile_options(lossy_bench PRIVATE -O2)
