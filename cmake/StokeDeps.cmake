# Third-party libraries, all from Debian 12 packages (scripts/setup.sh installs them).
find_package(Threads REQUIRED)
find_package(GTest REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(spdlog REQUIRED)
find_package(fmt REQUIRED)
find_package(CLI11 REQUIRED)
find_package(Boost 1.74 REQUIRED)   # header-only parts: Asio, Beast
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
# toml++ (Debian's libtomlplusplus-dev, a compiled library) for `stoke serve --config FILE.toml`.
pkg_check_modules(TOMLPP REQUIRED IMPORTED_TARGET tomlplusplus)
# OpenBLAS (pthreads flavour) for fp32 GEMM on the CPU backend.
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas openblas-pthread)
add_library(stoke_blas INTERFACE)
target_link_libraries(stoke_blas INTERFACE ${BLAS_LIBRARIES})
target_include_directories(stoke_blas INTERFACE ${CBLAS_INCLUDE_DIR})
# Prometheus client (core: registry + text exposition) for /metrics.
find_package(prometheus-cpp CONFIG REQUIRED)
