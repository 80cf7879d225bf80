// A native test's scratch directory: made fresh under $TEST_TMPDIR (Bazel's
// scratch space) or /tmp, and removed with everything in it (read-only
// directories a test made included) when the ScratchDir goes.
#ifndef GRAPHMOD_NATIVE_TEST_DIR_H_
#define GRAPHMOD_NATIVE_TEST_DIR_H_

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace graphmod_test {

// The names in a directory but "." and "..", sorted (none if it cannot be read).
inline std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d))
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
        names.emplace_back(e->d_name);
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

inline void RemoveTree(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return;
  if (!S_ISDIR(st.st_mode)) {
    unlink(path.c_str());
    return;
  }
  chmod(path.c_str(), 0755);
  for (const std::string& name : ListDir(path)) RemoveTree(path + "/" + name);
  rmdir(path.c_str());
}

class ScratchDir {
 public:
  // Exits the test (status 1) when no directory can be made.
  explicit ScratchDir(const char* test_name) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    path_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/" + test_name + ".XXXXXX";
    if (mkdtemp(&path_[0]) == nullptr) {
      std::perror("mkdtemp");
      std::exit(1);
    }
  }
  ~ScratchDir() { RemoveTree(path_); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace graphmod_test

#endif  // GRAPHMOD_NATIVE_TEST_DIR_H_
