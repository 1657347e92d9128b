// The two compressed lists Slurm puts in a job's environment, expanded.
//
//   ExpandSlurmHostList("gpu[07-09,12],login1")  // {"gpu07", "gpu08", "gpu09", "gpu12", "login1"}
//   ExpandSlurmTasksPerNode("4(x2),2")           // {4, 4, 2}: tasks on node 0, 1, 2
//
// SLURM_JOB_NODELIST's syntax (scontrol show hostnames): comma-separated names, each with
// any number of bracketed groups of numbers and ranges ("lo-hi", zero padding kept from
// lo), a name per combination in order. SLURM_TASKS_PER_NODE's: comma-separated counts,
// "n(xk)" for k nodes of n tasks.
#ifndef COMM_INTERNAL_SLURM_H_
#define COMM_INTERNAL_SLURM_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace comm {
namespace internal {

// InvalidArgument quoting the list for an empty list or name, an unclosed or empty
// bracket, a range whose end is below its start, or more than 1,000,000 names.
absl::StatusOr<std::vector<std::string>> ExpandSlurmHostList(absl::string_view list);

// InvalidArgument quoting the spec for anything that is not counts >= 1 (and repeats >= 1).
absl::StatusOr<std::vector<int>> ExpandSlurmTasksPerNode(absl::string_view spec);

}  // namespace internal
}  // namespace comm

#endif  // COMM_INTERNAL_SLURM_H_
