package main

import "testing"

func TestDbg(t *testing.T) {
	t.Log(words("buy a gpu"), words("delete user Deletes a user"))
}
