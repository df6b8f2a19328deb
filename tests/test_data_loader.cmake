# DataLoaderState <-> JSON (data/dataloader_json.hpp) uses nlohmann-json.
find_package(nlohmann_json 3 REQUIRED)
target_link_libraries(test_data_loader PRIVATE nlohmann_json::nlohmann_json)
