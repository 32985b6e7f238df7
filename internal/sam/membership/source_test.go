package membership_test

import (
	"sandstorm/internal/sam/membership"
	"sandstorm/internal/sam/meshnode"
)

// A member's policy is what a node's gateway and boundaries take their
// policy from (meshnode.Config.Policy): checked when the tests compile.
var (
	_ meshnode.PolicySource   = (*membership.PolicySource)(nil)
	_ meshnode.PolicyDocument = (*membership.PolicySource)(nil)
)
