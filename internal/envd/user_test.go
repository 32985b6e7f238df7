package envd

import "testing"

// TestNumericUser: a user given in numbers is that uid (and gid) when no
// account has that name; a name that is no number is still an error.
func TestNumericUser(t *testing.T) {
	for name, want := range map[string][2]uint32{"4242": {4242, 4242}, "4242:77": {4242, 77}} {
		a, err := lookupFresh(name)
		if err != nil || a.uid != want[0] || a.gid != want[1] || a.home != "/" {
			t.Errorf("%s: %+v, %v", name, a, err)
		}
	}
	for _, bad := range []string{"no-such-user-xyz", "4242:x", "-1"} {
		if _, err := lookupFresh(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}
