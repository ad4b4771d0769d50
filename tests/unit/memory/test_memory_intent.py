"""Forget intent only on an explicit request; "don't forget", "remember that", "I forgot"
and friends never delete anything. Two corpora of 60+ phrasings each."""

from __future__ import annotations

import pytest

from loopstack.memory import AsyncMemoryStore, Turn
from loopstack.memory.writeback import explicit_request, forget_request, plan_turn

FORGET = [
    "Forget my home address",
    "forget that I live in Berlin",
    "Please forget my phone number.",
    "please forget about my ex",
    "Forget about the dentist appointment",
    "Can you forget my birthday?",
    "Could you please forget that I work at Acme",
    "Would you forget my old email address",
    "I want you to forget my password hint",
    "I'd like you to forget my maiden name",
    "I need you to forget where I live",
    "You can forget my shoe size now",
    "You should forget the name of my previous employer",
    "OK, forget my wife's birthday",
    "Hey, forget the thing about my allergies",
    "Also forget my license plate",
    "Just forget my bank's name",
    "Okay please forget my gym schedule",
    "Forget the fact that I smoke",
    "forget all about my diet plan",
    "Don't remember my card number",
    "do not remember my address",
    "Never remember my passwords",
    "Please don't remember that I was sick last week",
    "Stop remembering my location",
    "Don't store my card number",
    "Please do not store my medical history",
    "Never store anything about my kids",
    "Don't save my social security details",
    "Do not save that I'm pregnant",
    "Stop storing my search history",
    "Don't keep my address",
    "Please don't keep any notes about my salary",
    "Never keep my phone number",
    "Stop tracking my workouts",
    "Don't record what I said about my boss",
    "Delete the memory about my old job",
    "Delete the memories of my trip to Rome",
    "Please delete any memories about my ex-girlfriend",
    "Remove the memory about my coffee order",
    "remove memories of my salary",
    "Erase the memory of my address",
    "Erase memories about my health",
    "Wipe the memories about my divorce",
    "Clear the notes about my landlord",
    "Delete my address from your memory",
    "Remove my phone number from memory",
    "Please erase my birthday from your memory",
    "Wipe my workplace from your memories",
    "Drop my old address out of your memory",
    "Delete what you know about my sister",
    "Delete everything you remember about my divorce",
    "Remove anything you stored about my health",
    "Erase all you have on file about my bank",
    "Forget everything you know about my old job",
    "Can you delete what you saved about my car",
    "Thanks. Now forget my hotel room number.",
    "That's all. Please forget my flight number!",
    "Could you remove the memory about my allergy to cats",
    "I'd like you to delete the memories about my previous address",
    "You may forget my nickname",
    "Please stop remembering my commute",
]

KEEP = [
    "Don't forget my dentist appointment is on Friday at 3pm",
    "don't forget that I'm vegetarian",
    "Do not forget my anniversary is June 4",
    "Never forget that I hate olives",
    "Please don't forget to remind me about the meeting",
    "Don't forget to call mom",
    "Let's not forget the budget review",
    "Remember that I live in Lisbon",
    "remember my wife's name is Ana",
    "Please remember that my flight is on Tuesday",
    "Remember: standup moved to 10am",
    "Keep in mind that I prefer Python",
    "Note that my manager is Priya",
    "I forgot my keys at the office",
    "I forgot to pay the electricity bill",
    "I forget things easily",
    "I always forget my umbrella",
    "I keep forgetting my password",
    "Sorry, I forgot what we discussed",
    "Oops I forgot the attachment",
    "Did you forget my order?",
    "You forgot to include the tax",
    "Have you forgotten my name?",
    "I don't remember where I parked",
    "I do not remember the address of the venue",
    "I can't remember his last name",
    "I never remember birthdays",
    "I don't want to forget this recipe",
    "Forget it, let's move on",
    "Oh forget it.",
    "forget that.",
    "Never mind, forget it",
    "Forget to bring the charger and you're stuck",
    "Don't let me forget the groceries",
    "Make sure I don't forget the passport",
    "So I don't forget: the code review is at 4",
    "It's easy to forget how big Texas is",
    "The movie 'Forget Paris' is great",
    "How do I delete a file in Python?",
    "Delete the file report.txt",
    "Remove the last paragraph from the draft",
    "Erase the whiteboard in room 4",
    "Clear the cache and restart the server",
    "Please delete the temporary branch",
    "Drop the users table in staging",
    "Don't keep me waiting",
    "Don't save the file yet",
    "Do not store the boxes in the garage",
    "Never keep food in the car",
    "Stop tracking changes in the document",
    "Don't record the meeting",
    "What do you remember about me?",
    "Do you remember my name?",
    "Remember when we talked about Rome?",
    "I remember the trip fondly",
    "My memory is getting worse",
    "The memory leak is in the parser",
    "How much memory does the server have?",
    "Unforgettable trip to Japan last year",
    "Forgetting the keys happens to everyone",
    "He said to forget about the deadline, it moved",
    "My favourite song is Don't Forget Me",
]


def test_corpora_are_big_enough() -> None:
    assert len(FORGET) >= 60 and len(KEEP) >= 60


@pytest.mark.parametrize("message", FORGET)
def test_explicit_forget_requests_are_detected(message: str) -> None:
    target = forget_request(message)
    assert target, message
    assert not target.lower().startswith(("forget", "delete", "remove", "don"))
    assert plan_turn(Turn(user_message=message))[0].kind == "forget"


@pytest.mark.parametrize("message", KEEP)
def test_everything_else_is_not_a_forget_request(message: str) -> None:
    assert forget_request(message) is None, message
    assert all(p.kind != "forget" for p in plan_turn(Turn(user_message=message)))


def test_dont_forget_is_a_request_to_remember() -> None:
    body = explicit_request("Don't forget my dentist appointment is on Friday at 3pm")
    assert body == "My dentist appointment is on Friday at 3pm"


async def test_dont_forget_stores_and_deletes_nothing(store: AsyncMemoryStore) -> None:
    keep = await store.add("My dentist appointment is on Monday at 9am", user_id="u1")
    res = await store.write_back(
        Turn(user_message="Don't forget my dentist appointment is on Friday at 3pm"),
        user_id="u1",
    )
    # stored, replacing Monday's time by the store's supersede rule - now reported as such
    # (issue #44: write-back used to say "stored"); superseding deletes nothing
    assert [(r.action, r.superseded) for r in res] == [("superseded", keep)]
    texts = {r.text for r in await store.list(user_id="u1", include_superseded=True)}
    assert "My dentist appointment is on Friday at 3pm" in texts
    assert (await store.get(keep, user_id="u1")).id == keep  # nothing was deleted
    res = await store.write_back(Turn(user_message="I forgot my dentist appointment"), user_id="u1")
    assert all(r.action != "forgotten" for r in res)


async def test_forget_request_deletes_the_matching_record(store: AsyncMemoryStore) -> None:
    await store.add("My gym is Fitness Park on Main Street", user_id="u1")
    keep = await store.add("I prefer green tea", user_id="u1")
    res = await store.write_back(
        Turn(user_message="Please forget that my gym is Fitness Park on Main Street"), user_id="u1"
    )
    assert res[0].action == "forgotten" and res[0].reason.startswith("1 ")
    assert [r.id for r in await store.list(user_id="u1")] == [keep]
