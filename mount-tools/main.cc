// ckptfs: the command-line tool. Subcommands grow with the layers.
#include <CLI/CLI.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  CLI::App app{"ckptfs: a compressing filesystem for deep-learning checkpoints"};
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
