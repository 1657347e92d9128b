// Runs a libFuzzer target (LLVMFuzzerTestOneInput) over a corpus, for `bazel test`:
//
//   corpus_main <dir or file>...
//
// Every file under each argument goes through the target as it is, then as seeded
// variants: each of a spread of single-bit flips, truncations at a spread of lengths,
// and bytes set to 0x00 and 0xff. The run is deterministic. A crash, an abort or a
// sanitizer report ends the process and fails the test; an empty corpus fails too, so
// the test cannot pass without running the target.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

void Collect(const std::string& path, std::vector<std::string>* files) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    std::fprintf(stderr, "corpus_main: cannot stat %s\n", path.c_str());
    return;
  }
  if (!S_ISDIR(st.st_mode)) {
    files->push_back(path);
    return;
  }
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return;
  std::vector<std::string> names;
  while (dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) Collect(path + "/" + name, files);
}

void Run(const std::string& bytes) {
  // A copy in its own allocation, so ASan sees reads past the end.
  std::vector<uint8_t> copy(bytes.begin(), bytes.end());
  LLVMFuzzerTestOneInput(copy.empty() ? nullptr : copy.data(), copy.size());
}

// Up to `count` positions spread over [0, n).
std::vector<size_t> Spread(size_t n, size_t count) {
  std::vector<size_t> out;
  if (n == 0) return out;
  if (n <= count) {
    for (size_t i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  for (size_t i = 0; i < count; ++i) out.push_back(i * n / count);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) Collect(argv[i], &files);
  if (files.empty()) {
    std::fprintf(stderr, "corpus_main: no corpus files under the arguments\n");
    return 1;
  }
  size_t inputs = 0;
  for (const std::string& path : files) {
    std::ifstream in(path, std::ios::binary);
    const std::string seed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Run(seed);
    ++inputs;
    for (size_t bit : Spread(seed.size() * 8, 512)) {
      std::string v = seed;
      v[bit / 8] = static_cast<char>(v[bit / 8] ^ (1u << (bit % 8)));
      Run(v);
      ++inputs;
    }
    for (size_t len : Spread(seed.size(), 64)) {
      Run(seed.substr(0, len));
      ++inputs;
    }
    for (size_t pos : Spread(seed.size(), 64)) {
      for (char b : {'\x00', '\xff'}) {
        std::string v = seed;
        v[pos] = b;
        Run(v);
        ++inputs;
      }
    }
  }
  std::printf("corpus_main: %zu corpus files, %zu inputs, no crash\n", files.size(), inputs);
  return 0;
}
