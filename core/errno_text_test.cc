#include "core/errno_text.h"

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace core {
namespace {

TEST(ErrnoTextTest, IsStrerror) {
  EXPECT_EQ(ErrnoText(ENOENT), std::string(std::strerror(ENOENT)));
  EXPECT_EQ(ErrnoText(EPIPE), std::string(std::strerror(EPIPE)));
  EXPECT_NE(ErrnoText(EACCES), ErrnoText(ENOENT));
}

TEST(ErrnoTextTest, UnknownValuesAreNamedByNumber) {
  const std::string text = ErrnoText(987654);
  EXPECT_FALSE(text.empty());
  EXPECT_NE(text.find("987654"), std::string::npos) << text;
}

TEST(ErrnoTextTest, ThreadsGetTheirOwnText) {
  std::vector<std::thread> threads;
  std::vector<std::string> got(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      const int err = t % 2 == 0 ? ENOENT : ECONNREFUSED;
      for (int i = 0; i < 1000; ++i) {
        if (ErrnoText(err) != ErrnoText(err)) got[t] = "changed";
      }
      got[t] += ErrnoText(err);
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < 8; ++t) {
    EXPECT_EQ(got[t], ErrnoText(t % 2 == 0 ? ENOENT : ECONNREFUSED)) << "thread " << t;
  }
}

}  // namespace
}  // namespace core
